"""The ``latentloop`` Typer application that the command modules register on."""

import typer

import latentloop

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
TEMPERATURE = typer.Option(
    1.0,
    "--temperature",
    help="ar and mdlm: sampling temperature (0 = greedy); gram: scale of the prior noise (0 = its mean).",
)
