"""Command line interface (a thin click layer over the library API)."""

import click


@click.group()
def main() -> None:
    """Pack chat fine-tuning data into audited, seam-safe Parquet shards."""
