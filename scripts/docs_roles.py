"""A griffe extension (mkdocs.yml, mkdocstrings `extensions:`): the docstrings' Sphinx roles
(``:meth:`Queue.complete```, ``:class:`~leaseq.Queue```, ``:data:``, ``:func:``, ``:attr:``,
``:mod:``, ``:exc:``) become the site's cross-references.

The docstrings keep the roles (they read well in ``help()`` and in an editor); the API
reference would otherwise print them literally. Each role's name is resolved in the scope of
the object whose docstring it is in, as Python would resolve it there, and becomes an
optional autoref: a link where the API reference shows the target, plain code where it does
not (a private helper, a module left out of the reference), never a broken link.
tests/docs/test_site.py checks that the built site shows no role.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:meth|class|func|data|attr|mod|exc|obj):`(~?)([\w.]+)(\(\))?`")


def _target(obj: griffe.Object, name: str) -> str:
    """The full path ``name`` means in ``obj``'s scope (``name`` itself when unresolved)."""
    head, _, rest = name.partition(".")
    try:
        found = obj.resolve(head)  # this scope, then its parents'
    except (griffe.NameResolutionError, griffe.AliasResolutionError):
        return name  # a full path already, or a name the reference does not show
    return f"{found}.{rest}" if rest else found


def _rewrite(obj: griffe.Object, text: str) -> str:
    def link(match: re.Match[str]) -> str:
        short, name = match[1], match[2]
        shown = name.rsplit(".", 1)[-1] if short else name
        target = html.escape(_target(obj, name), quote=True)
        code = f"<code>{html.escape(shown)}</code>"
        return f'<autoref identifier="{target}" optional>{code}</autoref>'

    return ROLE.sub(link, text)


def _walk(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        obj.docstring.value = _rewrite(obj, obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias and isinstance(member, griffe.Object):
            _walk(member)


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of a loaded package once, when the whole package is known
    (so names imported from elsewhere in it resolve)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _walk(pkg)
