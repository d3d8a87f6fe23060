"""The stage opened once and its work units: what every command that ingests shares."""
