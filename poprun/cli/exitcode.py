"""
Exit statuses (design.md section 3).

Layer: ``poprun.cli``.
"""

OK = 0
FAILURE = 1  # the instances succeeded, but their output could not be written (stdout on a full disk)
USAGE = 2  # a spec or command-line error: nothing was started
LAUNCH = 125  # poprun itself could not launch
NOT_EXECUTABLE = 126
NOT_FOUND = 127
