"""Sphinx directives of arrayfeed's documentation.

- ``{cli-help} [SUBCOMMAND]``: the ``--help`` text of ``arrayfeed [SUBCOMMAND]``, from
  :func:`arrayfeed._cli.build_parser`, so the CLI reference is the parser itself.
- ``api-rest`` (reStructuredText, inside ``{eval-rst}``): autodoc of every name of ``arrayfeed.__all__`` that the page has not
  documented above it (``:exceptions:`` for the errors only), so a new public name appears in the
  API reference without an edit. The build also warns (an error under ``-W``) when a public name
  (of ``arrayfeed`` or ``arrayfeed.storage``) is documented nowhere.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

import arrayfeed
import arrayfeed.storage
from arrayfeed._cli import build_parser

logger = logging.getLogger(__name__)

HELP_COLUMNS = "96"  # argparse wraps help text to $COLUMNS
_DOCUMENTED = re.compile(r"\.\. auto(?:function|class|exception|data):: arrayfeed\.(\w+)")


def cli_help(subcommand: str | None) -> str:
    """``arrayfeed [subcommand] --help`` as the parser prints it, wrapped at HELP_COLUMNS."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parser = build_parser()
        if subcommand is None:
            return parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and subcommand in action.choices:
                return str(action.choices[subcommand].format_help())
        raise ValueError(f"no subcommand {subcommand!r} in arrayfeed's parser")
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


class CliHelp(SphinxDirective):
    optional_arguments = 1

    def run(self) -> list[nodes.Node]:
        text = cli_help(self.arguments[0] if self.arguments else None)
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def public_names(module: Any = arrayfeed) -> list[str]:
    return [name for name in module.__all__ if name != "__version__"]


def _kind(obj: Any) -> str:
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return "autoexception"
    return "autoclass" if isinstance(obj, type) else "autofunction"


class ApiRest(SphinxDirective):
    option_spec = {"exceptions": directives.flag}  # noqa: RUF012

    def run(self) -> list[nodes.Node]:
        source = Path(self.env.doc2path(self.env.docname)).read_text(encoding="utf-8")
        line = self.lineno  # documented above this directive: the page's text before it
        before = "\n".join(source.splitlines()[: max(0, line - 1)])
        done = set(_DOCUMENTED.findall(before))
        done |= self.env.temp_data.setdefault("arrayfeed_api_rest", set())
        wanted = []
        for name in public_names():
            obj = getattr(arrayfeed, name)
            is_error = isinstance(obj, type) and issubclass(obj, BaseException)
            if name in done or ("exceptions" in self.options and not is_error):
                continue
            wanted.append((name, obj))
        if "exceptions" in self.options:  # the base class first, then by name
            wanted.sort(key=lambda item: (item[0] != "ArrayfeedError", item[0]))
        self.env.temp_data["arrayfeed_api_rest"].update(name for name, _ in wanted)
        text = "\n\n".join(
            f".. {_kind(obj)}:: arrayfeed.{name}"
            + ("\n   :show-inheritance:" if _kind(obj) == "autoexception" else "\n   :members:")
            for name, obj in wanted
        )
        container = nodes.container()
        self.state.nested_parse(
            self.content.__class__(text.splitlines(), source="api-rest"),
            self.content_offset,
            container,
        )
        return list(container.children)


def check_every_public_name(app: Sphinx, env: BuildEnvironment) -> None:
    documented = set(env.get_domain("py").objects)  # type: ignore[attr-defined]
    for module in (arrayfeed, arrayfeed.storage):
        for name in public_names(module):
            if f"{module.__name__}.{name}" not in documented:
                logger.warning(
                    "%s.%s is in %s.__all__ but not in the API reference",
                    module.__name__,
                    name,
                    module.__name__,
                )


#: Types whose runtime name is not the one users know (``tf.data.Dataset`` is ``DatasetV2``).
KNOWN_AS = {"DatasetV2": "tf.data.Dataset"}


def known_names(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None]:
    """Name types in signatures as users know them."""

    def rename(text: str | None) -> str | None:
        if text is None:
            return None
        for runtime, known in KNOWN_AS.items():
            text = re.sub(rf"\b(?:[\w.]+\.)?{runtime}\b", known, text)
        return text

    return rename(signature), rename(return_annotation)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("autodoc-process-signature", known_names)
    app.add_directive("cli-help", CliHelp)
    app.add_directive("api-rest", ApiRest)
    app.connect("env-check-consistency", check_every_public_name)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
