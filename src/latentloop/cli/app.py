"""The ``latentloop`` Typer application that the command modules register on."""

import typer

import latentloop
from latentloop.errors import UsageError

app = typer.Typer(
    name="latentloop",
    help="Models that reason by iterating in latent space: train, evaluate, generate, solve.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # docstrings' wrapped lines reflow to the terminal's width
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"latentloop {latentloop.__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Models that reason by iterating in latent space: train, evaluate, generate, solve."""


data_app = typer.Typer(help="Build datasets on disk.", no_args_is_help=True)
app.add_typer(data_app, name="data")

# Options that several commands share.
REVISION = typer.Option(
    None, "--revision", help="With a Hub model id (org/name): its branch, tag or commit (default main)."
)
WEIGHTS = typer.Option(
    None,
    "--weights",
    help="Keep the linear and embedding weights as int8 (one scale per output row): a quarter of fp32's bytes "
    "read per weight (default: as loaded).",
)
TEMPERATURE = typer.Option(
    1.0,
    "--temperature",
    help="ar and mdlm: sampling temperature (0 = greedy); gram: scale of the prior noise (0 = its mean).",
)


def int_list(text: str | None, option: str) -> list[int]:
    """A comma-separated list of distinct whole numbers of at least 1 (``1,2,4``) given to ``option``; empty
    when the option is not given."""
    if text is None:
        return []
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise UsageError(f"{option} must be comma-separated whole numbers, such as 1,4,16; got {text!r}")
    values = [int(part) for part in parts]
    if min(values) < 1:
        raise UsageError(f"{option} must be at least 1, got {text!r}")
    if len(set(values)) != len(values):
        raise UsageError(f"{option} lists a value twice: {text!r}")
    return values


def deprecated(old: str, new: str) -> None:
    """Say on stderr that option ``old`` is the deprecated spelling of ``new`` (kept for one release)."""
    typer.echo(f"warning: {old} is deprecated here and will be removed; use {new}", err=True)
