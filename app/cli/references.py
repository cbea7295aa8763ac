"""`memstore references install|check`: the pinned reference packages the writer profiles speak from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

references_cli = typer.Typer(
    help="The reference packages whose prompts the writer profiles send (installed without their "
    "dependencies, each file checked by hash).",
    no_args_is_help=True,
)

Root = Annotated[
    Path | None,
    typer.Option(
        help="Folder to install into and read from (default: MEMSTORE_REFERENCES_DIR, else beside the venv)."
    ),
]


def register(cli: typer.Typer) -> None:
    cli.add_typer(references_cli, name="references")


@references_cli.command("install")
def install(root: Root = None) -> None:
    """Install every pinned reference release (from the package registry, hash-checked) that is
    missing or altered; intact ones are left alone."""
    from app.writers import references

    folder = references.install(references.REFERENCES.values(), root)
    for reference in references.REFERENCES.values():
        typer.echo(f"{reference.label}: {references.folder(reference, folder)}")


@references_cli.command("check")
def check(root: Root = None) -> None:
    """Say which reference releases are installed and intact; exit 1 if one is not."""
    from app.writers import references

    broken = False
    for reference in references.REFERENCES.values():
        try:
            references.check([reference], root)
        except references.ReferencePackageError as exc:
            typer.echo(f"{reference.label}: {exc}", err=True)
            broken = True
        else:
            typer.echo(f"{reference.label}: ok ({references.folder(reference, root)})")
    if broken:
        raise typer.Exit(1)
