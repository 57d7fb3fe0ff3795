"""
Which variables' values text output masks, the secrets it masks in any text, and how a value is shown on one line.

Layer: ``poprun.core``; the standard library only. The planner's explanation, the renderers,
the CLI's logs and a backend's ``describe`` (the mpirun command) mask by this one rule; text
for people (explain, diff, logs, diagnostics, ``ps``, events) also goes through
:func:`mask_text`: URLs' passwords and secret-looking ``NAME=VALUE`` words, whatever holds them.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re

# Words that make a variable's name look secret (a substring, any case): masking one too many is
# the safe side (KEYBOARD_LAYOUT is masked too). SESSION is left out: most such names (DBUS_SESSION_BUS_ADDRESS,
# XDG_SESSION_ID) are not secrets; --mask names any other variable.
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "AUTH", "CREDENTIAL", "PRIVATE",
                "COOKIE")


def is_secret(name: str, mask: tuple[str, ...] = ()) -> bool:
    """
    Return whether a variable's value must be masked in text output.

    It is when its name holds a word that looks secret (TOKEN, SECRET, PASSWORD, PASSWD,
    PASSPHRASE, KEY, AUTH, CREDENTIAL(S), PRIVATE, COOKIE; any case), or is one of ``mask``
    (the plan's ``--mask`` names).
    """
    if name in mask:
        return True
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


MASK = "****"  # what stands for a URL's password in text output
_URL_PASSWORD: re.Pattern[str] | None = None  # the pattern, compiled on first use (start-up: ``re`` is not imported on a plain launch)


def mask_urls(text: str, *, same_length: bool = False) -> str:
    """
    Return ``text`` with the password of every URL in it masked: ``postgres://u:****@h/db``.

    A URL's password (``scheme://user:password@host``) is a secret whatever the variable or
    argument that holds it is called. The password runs to the last ``@`` before the host's
    ``/`` or a space, so one holding ``@`` is masked whole; a URL without a password is unchanged.
    ``same_length``: one ``*`` per character, so that a caret under a later column still points
    at its word (diagnostics).
    """
    if "://" not in text:
        return text
    global _URL_PASSWORD  # noqa: PLW0603 - compiled once, lazily
    if _URL_PASSWORD is None:
        import re

        _URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@'\"]*):(?P<password>[^\s/'\"]*)@")

    def masked(match: re.Match[str]) -> str:
        if not match["password"]:
            return match[0]
        return f"{match['head']}:{'*' * len(match['password']) if same_length else MASK}@"

    return _URL_PASSWORD.sub(masked, text)


_ASSIGNMENTS: tuple[re.Pattern[str], ...] = ()
_NAME = r"(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)"


def mask_text(text: str, mask: tuple[str, ...] = (), *, same_length: bool = False) -> str:
    """
    Return ``text`` for people, its secrets masked.

    URLs' passwords are masked (:func:`mask_urls`), and so are the values of ``NAME=VALUE`` words
    whose name looks secret or is in ``mask`` (``API_TOKEN=****``, ``--password=****``,
    ``'--password=a b'``, ``-x HF_TOKEN=****`` in a quoted command line).

    ``same_length``: one ``*`` per character (diagnostics, whose carets point at later columns).
    A secret given as a separate word (``--password hunter2``) is not recognised.
    """
    text = mask_urls(text, same_length=same_length)
    if "=" not in text:
        return text
    global _ASSIGNMENTS  # noqa: PLW0603 - compiled once, lazily
    if not _ASSIGNMENTS:
        import re

        _ASSIGNMENTS = (re.compile(rf"(?<='){_NAME}=(?P<value>[^'\n]+)(?=')"),  # a word quoted whole: 'NAME=a b'
                        re.compile(rf"(?<![^\s'\"]){_NAME}=(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s'\"]+)"))

    def masked(match: re.Match[str]) -> str:
        name = match["name"].lstrip("-")
        if not is_secret(name.replace("-", "_"), mask) or set(match["value"]) == {"*"}:
            return match[0]
        return f"{match['name']}={'*' * len(match['value']) if same_length else MASK}"

    for pattern in _ASSIGNMENTS:
        text = pattern.sub(masked, text)
    return text


def printable(text: str) -> str:
    """Return ``text`` as text output shows it: control characters (a newline) escaped, so that it is one line."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def controls_escaped(text: str) -> str:
    r"""
    Return ``text`` with its control and format characters escaped (``\x1b``, ``\u202e``, a newline), so that no terminal runs them.

    Not :func:`printable`, which escapes a whole value once any character needs it (its
    non-ASCII letters too): here only those characters are escaped, so that ``café`` stays as
    written, and a byte that was not UTF-8 (a surrogate escape) stays for the output layer to
    show as ``\xHH``, as everywhere else (diagnostics, ``plan --diff``).
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or "\udc80" <= c <= "\udcff" else c.encode("unicode_escape").decode("ascii")
                   for c in text)
