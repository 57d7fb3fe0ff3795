"""
The command line: argument handling, commands, views and exit statuses.

Layer: ``poprun.cli``, the top; the only layer that prints or exits.
"""
