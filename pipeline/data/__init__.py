"""The data stage: the scraped history (or the earlier scrape), its text, the token cache, packed blocks."""
