"""Reading the YAML a person writes (stack files, recipes): one loader that refuses a key
written twice in the same mapping, and one way to say what is wrong with a file.

PyYAML's `safe_load` keeps the last of two equal keys without a word (YAML 1.2 says keys of
a mapping are unique, https://yaml.org/spec/1.2.2/#mapping: "The content of a mapping node
is an unordered set of key/value node pairs, with the restriction that each of the keys is
unique"), so `maxNodes: 2` followed later by `maxNodes: 200` silently deploys 200. Here the
second one is an error naming both lines. Pure: PyYAML and the standard library.
"""

from __future__ import annotations

from typing import Any

import yaml

from amlhpc.core.errors import Problem


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping holds the same key twice; `problem_mark` is the second, `context_mark` the first."""


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (merge keys `<<` keep their YAML meaning)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error names it
                break
            if first is not None:
                raise DuplicateKeyError(
                    f"in the mapping starting on line {node.start_mark.line + 1}", first.start_mark,
                    f"duplicate key {key!r}: on line {first.start_mark.line + 1} and again on line "
                    f"{key_node.start_mark.line + 1}", key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """The YAML document in `text`; yaml.YAMLError (DuplicateKeyError included) when it is not valid."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def problem(exc: yaml.YAMLError, reference: str, syntax_hint: str = "fix the YAML syntax (indentation, quotes) at that line") -> Problem:
    """One Problem for a file that did not load: where (line, column), what, and the fix."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    if isinstance(exc, DuplicateKeyError):
        return Problem(reference, where, str(exc.problem),
                       "keep one of the two (YAML would silently use the last one)")
    return Problem(reference, where, f"not valid YAML: {getattr(exc, 'problem', None) or exc}", syntax_hint)
