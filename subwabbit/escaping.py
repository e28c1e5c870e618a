"""Turning untrusted text into safe VW feature and namespace names.

In VW's text format a space or tab ends a feature, ``:`` starts its value,
``|`` starts a namespace and a line break ends the example. A user id or an
item title pasted into a line as it is can therefore add features,
namespaces, labels or whole examples. :func:`escape_name` makes any text one
name that VW reads back as exactly that one name.

Example::

    from subwabbit import escape_name

    def format_common_features(self, common_features, debug_info=None):
        return f"|u user={escape_name(common_features['user_id'])}"

The encoding is injective (distinct inputs give distinct names, so distinct
users stay distinct features) and leaves ordinary names untouched, so names
stay readable in audit explanations.

.. note:: ``^`` and ``*`` stay as they are: vw reads them as part of the
   name, but an audit explanation writes ``namespace^feature`` and joins
   interacted features with ``*``, so a name holding them reads ambiguously
   there (``5*stars`` looks like an interaction of ``5`` and ``stars``).
   Escaping them would change the names, and so the hashes, of features
   that models already learnt.

.. note:: Interactions such as ``-q ui`` pair namespaces by their *first
   character*. Start a namespace with a fixed letter of your own and escape
   only the untrusted rest: ``f"|u{escape_name(source)} ..."``.

.. note:: VW hashes a feature name made only of digits as that number, so
   ``"01"`` and ``"1"`` are the same feature. Give ids a prefix
   (``user=01``), as in the example above.
"""

__all__ = ["escape_name"]

# Characters that VW's text parser treats specially, plus the escape character.
_SPECIAL = frozenset("%|: \t")


def _escape_char(char: str) -> str:
    return "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))


def escape_name(text: object) -> str:
    """Escape ``text`` into a single VW feature or namespace name.

    ``%``, ``|``, ``:``, space, tab and every character that is not printable
    (line breaks, NUL and other control characters, Unicode line and
    paragraph separators, ...) are replaced by ``%XX``, the hexadecimal bytes
    of their UTF-8 encoding. Other characters, printable non-ASCII included,
    stay as they are. The empty string becomes ``%``, which no other input
    produces.

    :param text: a string; other objects (ints, ...) are converted with :func:`str`
    :returns: a non-empty name without whitespace, ``|``, ``:`` or line breaks
    """
    if not isinstance(text, str):
        text = str(text)
    if not text:
        return "%"
    if text.isprintable() and _SPECIAL.isdisjoint(text):
        return text
    return "".join(_escape_char(char) if char in _SPECIAL or not char.isprintable() else char
                   for char in text)
