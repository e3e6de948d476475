"""The command line (typer + rich)."""
