"""A backend plugin of the golden cases: one of two that declare the name gpu."""


class Backend:
    name = "gpu"
