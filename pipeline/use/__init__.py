"""What people do with a run: generate, export, the commit hook, diff, report, monitor, the command line."""
