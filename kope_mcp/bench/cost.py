"""What `kope bench --agent llm` will cost before it starts, and the budget it stops at.

The estimate (prompt tokens; completions are small beside them) follows how an episode spends them
(llm_episode.py): every model call resends the whole chat, which holds the tool schemas, the task, what the arm
read from the memory and the turns so far, up to the arm's window. Per attempt the model makes about
`CALLS_PER_ATTEMPT` calls (compile, test, profile, record, a reply) and adds about `TOKENS_PER_ATTEMPT` (its
kernel and the tools' answers). What an arm reads per iteration: passive, shuffled and A/A the whole history
(`TOKENS_PER_MEMORY_ATTEMPT` per attempt in the memory), active its query budget, static and oracle an order. The
memory's size is the warm-up's attempts (and any import), known from the configuration. It is an estimate: the
report counts what the endpoint's `usage` said.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from kope_mcp.bench.agent import parse_arm
from kope_mcp.bench.config import MEMORYLESS, BenchConfig
from kope_mcp.bench.memories import attempts_in

CALLS_PER_ATTEMPT = 5
TOKENS_PER_ATTEMPT = 1_400  # a kernel (~400) and four tool answers (~250 each)
TOKENS_PER_MEMORY_ATTEMPT = 130  # kope://memory/history.json per attempt (45k tokens for ~350 attempts)
TASK_TOKENS = 1_200  # the system prompt and get_task's answer
ORDER_TOKENS = 120  # static's and oracle's strategy order
ACTIVE_READ = 2_000  # query_experience's token budget (LlmSettings.token_budget)


@dataclass
class Estimate:
    memory_attempts: int
    per_task: dict[str, int]  # arm -> prompt tokens per held-out task
    tasks: int  # held-out (task, seed) pairs, each worked by every arm

    @property
    def per_arm(self) -> dict[str, int]:
        return {arm: tokens * self.tasks for arm, tokens in self.per_task.items()}

    @property
    def total(self) -> int:
        return sum(self.per_arm.values())

    def lines(self) -> list[str]:
        rows = [f"  {arm:<14} {tokens:>13,}" for arm, tokens in self.per_arm.items()]
        return [f"estimate: {self.total:,} prompt tokens ({self.tasks} held-out task(s) x {len(self.per_task)} arms; "
                f"memory of about {self.memory_attempts:,} attempts), per arm:", *rows]


def schema_tokens() -> int:
    """The tool schemas' tokens as the model is sent them (the packaged tool list)."""
    from kope_mcp.experience.tokens import count_tokens

    listed = json.loads(resources.files("kope_mcp.app").joinpath("tool_list.json").read_text())
    return count_tokens(json.dumps(listed["result"]["tools"]))


def memory_attempts(config: BenchConfig, warm_tasks: int, one_core_tasks: int) -> int:
    """Attempts the warmed memory will hold: every warm-up attempt, here and on one core, and the imports."""
    per_task = config.warm_budget or config.budget
    imported = sum(attempts_in(path) for path in config.imports if path.is_file())
    return (warm_tasks + (one_core_tasks if config.one_core_warmup else 0)) * per_task * config.warm_passes \
        + imported


def per_task_tokens(arm: str, budget: int, window: int, memory: int, schemas: int) -> int:
    """Prompt tokens one arm spends on one task: each call resends the chat, capped at the window."""
    policy, arm_window = parse_arm(arm)
    cap = arm_window or window
    read = {"passive": memory * TOKENS_PER_MEMORY_ATTEMPT, "shuffled": memory * TOKENS_PER_MEMORY_ATTEMPT,
            "aa": memory * TOKENS_PER_MEMORY_ATTEMPT, "active": ACTIVE_READ}.get(policy, 0)
    fixed = schemas + TASK_TOKENS + (ORDER_TOKENS if policy in ("static", "oracle", "aa") else 0)
    total = 0
    chat = fixed
    for _ in range(budget):
        chat = min(cap, chat + read + TOKENS_PER_ATTEMPT)  # what it read, then its attempt's turns
        total += CALLS_PER_ATTEMPT * min(cap, chat)
    return total


def estimate(config: BenchConfig, warm_tasks: int, one_core_tasks: int, held_out: int,
             context_window: int) -> Estimate:
    """Every arm on the whole memory, and the arms run again from each smaller memory (`--memory-sizes`)."""
    memory = memory_attempts(config, warm_tasks, one_core_tasks)
    schemas = schema_tokens()
    per_task = {arm: per_task_tokens(arm, config.budget, context_window, memory, schemas) for arm in config.arms}
    for size in sorted(n for n in config.memory_sizes if n < memory):
        per_task |= {f"{arm} [{size}]": per_task_tokens(arm, config.budget, context_window, size, schemas)
                     for arm in config.arms_at(str(size)) if arm not in MEMORYLESS}
    return Estimate(memory, per_task, held_out)


class Meter:
    """Tokens the model spent in this run (a resumed run's included); past `limit` the next task is not begun."""

    def __init__(self, limit: int | None, spent: int = 0) -> None:
        self.limit = limit
        self.spent = spent

    def add(self, prompt: int, completion: int) -> None:
        self.spent += prompt + completion

    def check(self) -> None:
        if self.limit is not None and self.spent >= self.limit:
            raise BudgetSpent(f"the token budget is spent ({self.spent:,} of --max-tokens {self.limit:,}); what "
                              "finished is kept: `kope bench --resume DIR --max-tokens N` goes on")


class BudgetSpent(RuntimeError):
    """The run reached `--max-tokens`: what it finished is kept, and `--resume` goes on."""
