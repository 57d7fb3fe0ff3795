"""A backend plugin of the golden cases: its constructor raises."""


class Backend:
    name = "gpu"

    def __init__(self) -> None:
        raise RuntimeError("no GPU driver loaded")
