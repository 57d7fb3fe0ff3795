"""
Which variables' values text output masks.

Layer: ``poprun.core``; the standard library only. The planner's explanation, the renderers,
the CLI's logs and a backend's ``describe`` (the mpirun command) mask by this one rule.
"""

from __future__ import annotations

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
