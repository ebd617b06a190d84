"""What goes wrong in scraping that the user can fix; the message names the repository and the fix."""


class ScrapeError(Exception):
    """A problem the user can fix (the CLI prints the message on one line and exits with `exit_code`)."""

    exit_code = 2


class RepositoryError(ScrapeError):
    """The path is not a usable git repository (missing, empty, unreadable history)."""
