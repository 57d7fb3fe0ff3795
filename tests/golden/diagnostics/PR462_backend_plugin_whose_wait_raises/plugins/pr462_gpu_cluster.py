"""A backend plugin of the golden cases: its launch's wait raises."""


class Backend:
    name = "gpu"

    def launch(self, _plan: object, **_arguments: object) -> "Launch":
        return Launch()


class Launch:
    def wait(self) -> None:
        raise ConnectionError("the cluster manager hung up")

    def terminate(self, grace_s: float) -> None:
        pass
