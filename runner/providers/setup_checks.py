"""What a provider needs before its first request, and the checks that say so before anything is sent: the
environment variable it reads its key from (:meth:`SetupChecks.key_variables`, :meth:`SetupChecks.api_key`), the
modules of its SDK and the package extra that installs them, and a probe of its endpoint (``runner check`` and the
first seconds of ``runner submit``). Mixed into :class:`~runner.providers.base.Provider`; each failure is one
sentence (``ModelSetupError``)."""

from __future__ import annotations

import importlib.util
import os
from typing import ClassVar

from runner.errors import ModelSetupError

__all__ = ["SetupChecks"]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


class SetupChecks:
    """Mixed into :class:`~runner.providers.base.Provider` (see the module's docstring): a provider sets the class
    attributes, and may override :meth:`probe` and :meth:`key_variables`."""

    #: environment variable read for the key when the job does not name another
    key_env_var: ClassVar[str | None] = None
    #: the modules this provider's SDK brings (``("anthropic",)``); :meth:`check_sdk` finds them before anything is
    #: sent, so a missing one is one sentence, not an ImportError in the middle of a run
    sdk_modules: ClassVar[tuple[str, ...]] = ()
    #: the package extra that installs them (``pip install 'llm-job-runner[EXTRA]'``)
    extra: ClassVar[str | None] = None

    def key_variables(self) -> list[str]:
        """The environment variables this provider reads its key from, in order of preference."""
        variable = self.settings.api_key_env or self.key_env_var
        return [variable] if variable else []

    def api_key(self) -> str:
        """The key from the environment ('' when none is set); never stored, logged or shown."""
        return next((os.environ[v] for v in self.key_variables() if os.environ.get(v)), "")

    def check_key(self, model: str) -> None:
        """Raise ``ModelSetupError`` naming the variable to set when this provider needs a key it lacks."""
        variables = self.key_variables()
        if variables and not self.api_key():
            names = " or ".join(variables)
            raise ModelSetupError(f"{self.name}:{model} needs an API key: export {names} (no request was sent)")

    def check_sdk(self, model: str) -> None:
        """Raise ``ModelSetupError`` giving the pip command when a module of this provider's SDK is not installed."""
        missing = [module for module in self.sdk_modules if not _importable(module)]
        if missing:
            install = f"pip install 'llm-job-runner[{self.extra}]'" if self.extra else f"pip install {missing[0]}"
            raise ModelSetupError(f"{self.name}:{model} needs the {missing[0]} package, which is not installed: "
                                  f"{install} (no request was sent)")

    async def probe(self, model: str) -> None:  # noqa: B027 - optional hook
        """Check, with the cheapest call the API has (a model lookup, a models list, or one token), that the
        endpoint answers, takes the key and knows ``model`` (for clouds: the deployment, project or region too).
        Raises the runner's errors (``AuthError``, ``ModelSetupError``, ``TransientError``...) with one sentence
        each; ``runner check`` and the first seconds of ``runner submit`` call it, after :meth:`start`. The
        default checks nothing (a provider without a cheap call)."""
