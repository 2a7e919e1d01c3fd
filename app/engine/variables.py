"""The variable methods of `ThreadState` (§8): a variable as the state resolves it, and `set_env`, which stores a
thread value (a secret when the agent's graph or the thread says so) and passes it on to the live descendants."""

from __future__ import annotations

from cryptography.fernet import Fernet

from app import environment, errors
from app.catalog import Catalog
from app.engine import types
from app.engine.messages import own, refuse_nul
from app.spec.state import ExecutionState


class Variables:
    """The thread's variables, over the state's transaction and its step's resolver (`types.Env`)."""

    def __init__(
        self,
        transaction: types.Transaction,
        catalog: Catalog,
        fernet: Fernet,
        env: types.Env,
        agent: str,
        execution: ExecutionState | None,
    ) -> None:
        self._transaction = transaction
        self._catalog = catalog
        self._fernet = fernet
        self._env = env
        self._agent = agent
        self._execution = execution

    def get(self, name: str, tool_env: dict[str, str] | None) -> str:
        """`state.env`: the tool's config env first, then the thread's layers."""
        return self._env.get(name, tool_env)

    async def set(self, name: str, value: str) -> None:
        """`state.set_env`."""
        own(self._execution, "set_env")
        if not isinstance(name, str) or not isinstance(value, str):
            raise errors.Invalid("`state.set_env` takes a variable name and a string value")
        environment.check_name(name)
        refuse_nul(name, value)
        declared = self._catalog.secret_names(self._agent)
        async with self._transaction() as (session, thread):
            secret = name in declared or (await environment.thread_types(session, thread.id)).get(name) == "secret"
            await environment.set_thread(session, self._fernet, thread.id, {name: value}, {name} if secret else set())
            if thread.has_children:  # live descendants see it from their next step on (§8)
                scoped_in = [a for a in self._catalog.agents if self._scoped(a, name)]
                await environment.propagate(session, thread.id, name, scoped_in)
        # the step's resolver is shared by its tool calls: later `env` calls of this step see the value
        self._env.thread[name] = environment.Value(value, "secret" if secret else "text")

    def _scoped(self, agent: str, name: str) -> bool:
        """Whether the agent's graph declares `name` scoped (its threads do not inherit it, as at creation, §6.7)."""
        return any(v.name == name and v.scoped for v in self._catalog.variables_of_agent(agent))
