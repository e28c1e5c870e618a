"""Parsing the feature lines of VW's audit mode into explanations.

With ``--audit`` the engine prints, for every example, a line of
tab-separated features ``namespace^feature:hashindex:value:weight[@adaptive]``
(9.x starts the line with a tab; quadratic and higher interactions appear as
``a^x*b^y``; the ``@...`` part is missing under ``-t``).

Matrix factorisation (``--rank``) prints the hash index with the weight slot
it reads in parentheses (``a^x:443456(443456):1:0.07``), and for each latent
factor of each ``-q`` pair one entry with both features and the product of
their factor weights
(``a^x:443457(443457):2:-0.06:b^z:997499(997499):3:0.14:-0.009``); such an
entry is read as the interaction ``a^x*b^z`` with the product of the two
values as its value and the product of the two weights as its weight, so
that value times weight is its contribution to the raw score.
"""

import html
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple


class AuditFeature(NamedTuple):
    """One feature of an audit line."""

    #: the name as vw prints it, e.g. ``u^u12*i^i7``
    name: str
    hashindex: int
    value: float
    weight: float


#: A hash index as ``--rank`` prints it: the index, then the weight slot read.
_RANK_INDEX = r"\d+\((\d+)\)"
#: A ``--rank`` entry of one latent factor of a pair: name, index, value and
#: factor weight of each feature, then the product of the two weights.
_RANK_PAIR = re.compile(rf"(.+?):{_RANK_INDEX}:([^:]+):([^:]+):"
                        rf"(.+):{_RANK_INDEX}:([^:]+):([^:]+):([^:]+)")


def _hashindex(text: str) -> int:
    """A hash index: ``123``, or ``123(456)`` from ``--rank`` (the slot read, 456)."""
    rank_index = re.fullmatch(_RANK_INDEX, text)
    return int(rank_index.group(1)) if rank_index else int(text)


def parse_audit_features(explanation_string: str) -> List[AuditFeature]:
    """Split an audit line into its features.

    :param explanation_string: the line, with or without its leading tab
    :returns: the features in the order vw printed them
    :raises ValueError: for an entry that does not have the audit shape
    """
    features = []
    for entry in explanation_string.strip("\r\n").split("\t"):
        if not entry:
            continue
        pair = _RANK_PAIR.fullmatch(entry) if "(" in entry else None
        if pair:
            left, index, left_value, _, right, _, right_value, _, product = pair.groups()
            features.append(AuditFeature(f"{left}*{right}", int(index),
                                         float(left_value) * float(right_value), float(product)))
            continue
        parts = entry.rsplit(":", 3)
        if len(parts) != 4:
            raise ValueError(f"not an audit feature (name:hashindex:value:weight): {entry!r}")
        name, hashindex, value, weight = parts
        features.append(AuditFeature(name, _hashindex(hashindex), float(value),
                                     float(weight.split("@", 1)[0])))
    return features


def explain_features(explanation_string: str,
                     parse_element: Callable[[str, Any], Tuple[str, str]],
                     feature_translator: Any = None) -> List[Dict[str, Any]]:
    """Turn an audit line into dicts sorted by contribution (largest first).

    Each dict holds ``names`` (a ``(namespace, feature)`` pair per element of an
    interaction, as ``parse_element`` translates it), ``original_feature_name``,
    ``hashindex``, ``value``, ``weight``, ``potential`` (value times weight) and
    ``relative_potential`` (its share of the sum of absolute potentials).
    """
    rows: List[Dict[str, Any]] = []
    for feature in parse_audit_features(explanation_string):
        rows.append({
            "names": [parse_element(element, feature_translator)
                      for element in feature.name.split("*")],
            "original_feature_name": feature.name,
            "hashindex": feature.hashindex,
            "value": feature.value,
            "weight": feature.weight,
            "potential": feature.value * feature.weight,
        })
    total = sum(abs(row["potential"]) for row in rows) or 1.0
    for row in rows:
        row["relative_potential"] = abs(row["potential"]) / total
    rows.sort(key=lambda row: row["relative_potential"], reverse=True)
    return rows


class HtmlExplanation(str):
    """An HTML table that Jupyter renders (through ``_repr_html_``) without IPython
    being a dependency; otherwise a plain string. Its :attr:`data` holds the
    HTML as that of the ``IPython.display.HTML`` object subwabbit 2.x returned
    did."""

    def _repr_html_(self) -> str:
        return str(self)

    @property
    def data(self) -> str:
        """The HTML, as a plain ``str`` (2.x's ``IPython.display.HTML.data``)."""
        return str(self)


def explanation_html(rows: List[Dict[str, Any]], max_rows: Optional[int] = None) -> HtmlExplanation:
    """Render rows from :func:`explain_features` as an HTML table with bars.

    :param rows: the explanation
    :param max_rows: show only this many of the most important features
    """
    body = []
    for row in rows[:max_rows] if max_rows is not None else rows:
        name = ' <span style="color: grey">&times;</span> '.join(
            f"{html.escape(namespace)}: <i>{html.escape(feature)}</i>" if namespace
            else f"<i>{html.escape(feature)}</i>"
            for namespace, feature in row["names"])
        colour = "green" if row["potential"] > 0 else "red"
        body.append(
            "<tr>"
            '<td><div style="width: 100px; border: 1px solid; border-radius: 4px">'
            f'<div style="width: {row["relative_potential"] * 100:.1f}%; height: 16px; '
            f'background-color: {colour}"></div></div></td>'
            f'<td>{row["potential"]:.4f}</td><td>{row["value"]:.4f}</td>'
            f'<td>{row["weight"]:.4f}</td><td>{name}</td>'
            "</tr>")
    return HtmlExplanation(
        "<table><thead><tr><th>Relative potential</th><th>Potential</th><th>Value</th>"
        "<th>Weight</th><th>Feature</th></tr></thead><tbody>" + "".join(body) + "</tbody></table>")
