"""What each command does, stage by stage: the sequences a newcomer reads after the entry point."""
