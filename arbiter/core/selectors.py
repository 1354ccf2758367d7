"""Kubernetes label selectors (matchLabels + matchExpressions), parsed and matched.

A Queue's `spec.namespaceSelector` admits the namespaces whose labels it
matches (DESIGN §3). The semantics are the apiserver's: every matchLabels
pair and every expression must hold; `In` / `NotIn` take a non-empty value
list, `Exists` / `DoesNotExist` none; `NotIn` and `DoesNotExist` hold for a
label that is absent; the empty selector matches everything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
OPERATORS: tuple[Operator, ...] = ("In", "NotIn", "Exists", "DoesNotExist")
# Expressions and values a selector may carry: a selector is matched on the
# webhook's request path, so its cost is bounded where it is accepted.
MAX_EXPRESSIONS = 32
MAX_VALUES = 64


class SelectorError(ValueError):
    """A selector that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def holds(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        return value is None


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.holds(labels) for requirement in self.requirements)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise SelectorError(f"{where}: must be a non-empty string")
    return value[:317]  # a qualified label key is at most 253 + 1 + 63 characters


def parse_selector(raw: Any, field: str) -> LabelSelector | None:
    """`raw` (a LabelSelector object, or None) -> a selector; None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SelectorError(f"{field}: must be an object with matchLabels and/or "
                            "matchExpressions")
    unknown = sorted(str(key)[:40] for key in raw if key not in ("matchLabels",
                                                                 "matchExpressions"))
    if unknown:
        raise SelectorError(f"{field}: unknown field {unknown[0]} (use matchLabels and "
                            "matchExpressions)")
    requirements: list[Requirement] = []
    labels = raw.get("matchLabels")
    if labels is not None:
        if not isinstance(labels, Mapping) or not all(
                isinstance(v, str) for v in labels.values()):
            raise SelectorError(f"{field}.matchLabels: must map label keys to string values")
        if len(labels) > MAX_EXPRESSIONS:
            raise SelectorError(f"{field}.matchLabels: at most {MAX_EXPRESSIONS} labels")
        for key, value in cast(Mapping[Any, str], labels).items():
            requirements.append(Requirement(_text(key, f"{field}.matchLabels"), "In",
                                            frozenset({value})))
    expressions = raw.get("matchExpressions")
    if expressions is not None:
        where = f"{field}.matchExpressions"
        if not isinstance(expressions, list):
            raise SelectorError(f"{where}: must be a list")
        if len(expressions) + len(requirements) > MAX_EXPRESSIONS:
            raise SelectorError(f"{field}: at most {MAX_EXPRESSIONS} labels and expressions")
        for index, expression in enumerate(expressions):
            requirements.append(_requirement(expression, f"{where}[{index}]"))
    return LabelSelector(tuple(requirements))


def _requirement(raw: Any, where: str) -> Requirement:
    if not isinstance(raw, Mapping):
        raise SelectorError(f"{where}: must be an object with key, operator and values")
    key = _text(raw.get("key"), f"{where}.key")
    operator = raw.get("operator")
    if operator not in OPERATORS:
        shown = str(operator)[:40]
        raise SelectorError(f"{where}.operator: \"{shown}\" must be one of "
                            f"{', '.join(OPERATORS)}")
    values = raw.get("values")
    if values is None:
        values = []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SelectorError(f"{where}.values: must be a list of strings")
    if len(values) > MAX_VALUES:
        raise SelectorError(f"{where}.values: at most {MAX_VALUES} values")
    if operator in ("In", "NotIn") and not values:
        raise SelectorError(f"{where}.values: must not be empty for operator {operator}")
    if operator in ("Exists", "DoesNotExist") and values:
        raise SelectorError(f"{where}.values: must be empty for operator {operator}")
    return Requirement(key, cast(Operator, operator), frozenset(values))
