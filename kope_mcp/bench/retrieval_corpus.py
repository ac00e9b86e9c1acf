"""A generated memory with ground truth, for measuring retrieval (`tools/bench_retrieval.py`).

A team's shared memory, as `kope memory import` would load it: measured wins, pitfalls and compile-error fixes
(the ground truth), buried in noise that is hard for a retriever (tweaks within measurement noise that name the
same task and hardware, short filler, other hardware, other families). Queries are written as an agent asks
mid-task and never reuse a lesson's wording: the query vocabulary of every strategy is disjoint from its lesson
vocabulary, and compile errors are pasted as the compiler prints them, with other names and line numbers.

Everything is derived from one seed, so a corpus and its queries are the same on every machine.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kope_mcp.memory.admin import HomeSeal, export_line
from kope_mcp.memory.records import AgentInfo, AttemptRecord, SessionRecord
from kope_mcp.memory.signature import compile_signature
from kope_mcp.tasks.registry import TaskRegistry

QueryKind = Literal["paraphrase", "natural", "compile_error", "error_elsewhere", "unseen_family", "what_worked_here",
                    "what_worked_family", "what_worked_other_hw", "nothing_here_yet"]

HERE = "x86_64/AMD EPYC/2c/avx512f"
HARDWARE = {
    HERE: "cpu",
    "x86_64/Intel Xeon 8480/56c/avx512f": "cpu",
    "aarch64/AWS Graviton3/64c/sve": "cpu",
    "cuda/NVIDIA H100/sm_90": "gpu",
}
UNSEEN_FAMILIES = ("scan", "pooling")  # no history at all: questions about them need general knowledge
# A machine the memory has never seen: what worked on the same task elsewhere is all there is to offer.
NEW_MACHINE = "x86_64/AMD EPYC 9754/128c/avx512f"


@dataclass(frozen=True)
class Strategy:
    name: str
    lesson: tuple[str, ...]  # how a lesson words it ({task}, {x} = speedup)
    asked: tuple[str, ...]  # how an agent asks about it, in other words
    cpu: tuple[float, float]  # speedup range on a CPU; (0, 0): not applicable
    gpu: tuple[float, float]


STRATEGIES: tuple[Strategy, ...] = (
    Strategy("OpenMP parallel for over rows",
             ("#pragma omp parallel for on the outer row loop of {task} scaled with the core count: {x}x",
              "Spreading the rows of {task} over threads with an omp parallel for gave {x}x"),
             ("does splitting the work across all cores pay off", "should I run it multithreaded"),
             (1.8, 30.0), (0, 0)),
    Strategy("AVX-512 intrinsics",
             ("Hand-written _mm512 intrinsics, 16 floats per instruction in the inner loop of {task}: {x}x",),
             ("would explicit SIMD vector instructions help", "is manual vectorisation with wide registers worth it"),
             (1.5, 4.0), (0, 0)),
    Strategy("multiple accumulators",
             ("Four independent partial sums broke the add dependency chain in {task}: {x}x",
              "Splitting the accumulator of {task} into 4 lanes hid the FP add latency: {x}x"),
             ("how do I get around the latency of a serial sum", "my reduction loop is latency bound, ideas"),
             (1.3, 3.5), (0, 0)),
    Strategy("cache tiling 64x64",
             ("Blocking {task} into 64x64 tiles kept the working set in L2: {x}x",),
             ("how should I restructure loops for better locality", "the data does not stay in cache, what helps"),
             (1.4, 6.0), (0, 0)),
    Strategy("loop interchange",
             ("Reordering the loops of {task} so the innermost walks contiguous memory: {x}x",),
             ("my inner loop strides through memory, fix", "which loop order is right"),
             (1.2, 5.0), (0, 0)),
    Strategy("shared-memory tiling",
             ("Staging tiles of {task} in __shared__ memory cut global loads: {x}x on the GPU",),
             ("how to reuse data within a thread block", "too many global memory reads on the GPU"),
             (0, 0), (2.0, 12.0)),
    Strategy("warp shuffle reduction",
             ("__shfl_down_sync reduction inside each warp for {task}: {x}x",),
             ("fast way to combine values across GPU lanes", "reducing inside a warp without shared memory"),
             (0, 0), (1.5, 5.0)),
    Strategy("coalesced loads",
             ("Making consecutive threads read consecutive addresses in {task}: {x}x",),
             ("GPU memory access pattern advice", "my threads read scattered addresses"),
             (0, 0), (1.5, 8.0)),
)
PITFALLS: tuple[tuple[str, str, str], ...] = (
    ("unroll by 16", "Unrolling {task} by 16 spilled registers and ran at {x}x", "is aggressive unrolling a good idea"),
    ("-ffast-math", "-ffast-math on {task} broke the NaN handling: wrong results",
     "can I relax floating point rules for speed"),
    ("software prefetch", "__builtin_prefetch 8 lines ahead in {task} changed nothing: {x}x",
     "should I prefetch manually"),
)
FIXES: tuple[tuple[str, str, str], ...] = (
    ("include immintrin.h",
     "gcc did not know _mm256_fmadd_ps until <immintrin.h> was included and -mfma passed",
     "{file}:{line}:13: error: implicit declaration of function '_mm256_fmadd_ps'; did you mean "
     "'_mm_fmadd_ps'? [-Werror=implicit-function-declaration]"),
    ("include omp.h",
     "omp_get_thread_num was unknown to the compiler until <omp.h> was included and -fopenmp passed",
     "{file}:{line}:21: error: implicit declaration of function 'omp_get_thread_num' "
     "[-Werror=implicit-function-declaration]"),
    ("match the prototype",
     "conflicting types for kernel: the size parameter must be int64_t as in the task, not int",
     "{file}:{line}:6: error: conflicting types for 'kernel'; have 'void(const float *, float *, int)'"),
    ("target attribute for AVX-512",
     "always_inline _mm512_ intrinsics failed with a target specific option mismatch; -mavx512f fixed it",
     "/usr/lib/gcc/x86_64-linux-gnu/12/include/avx512fintrin.h:{line}:1: error: inlining failed in call to "
     "'always_inline' '_mm512_add_ps': target specific option mismatch"),
    ("256-bit cast",
     "Initialising an __m256 from an __m128 is a type error; use _mm256_castps128_ps256",
     "{file}:{line}:19: error: incompatible types when initializing type '__m256' using type '__m128'"),
    ("declare loop variable",
     "A loop counter declared inside the omp pragma line did not compile; declare it in the for statement",
     "{file}:{line}:9: error: for statement expected before 'int'"),
)
# Compile errors recorded as the workflow records them: a failed attempt (its error signature) and the next attempt
# that compiled, with the agent's lesson on it. The lesson never names the identifier of the error, and the
# question pastes the same mistake with other identifiers on a task of another family: only the normalised
# signature links them. (name, recorded message, asked message, what failed, the lesson)
ERROR_TRANSFERS: tuple[tuple[str, str, str, str, str], ...] = (
    ("intrinsics header", "implicit declaration of function '_mm256_fmadd_ps'; did you mean '_mm_fmadd_ps'? "
     "[-Werror=implicit-function-declaration]", "implicit declaration of function '_mm512_fmadd_ps'; did you mean "
     "'_mm_fmadd_ps'? [-Werror=implicit-function-declaration]", "FMA through intrinsics",
     "the vector header was never included: add it at the top and pass the matching -m option"),
    ("kernel prototype", "conflicting types for 'kernel'; have 'void(const float *, float *, int)'",
     "conflicting types for 'kernel'; have 'void(const float *, const float *, float *, long int)'",
     "rewrote the signature", "copy the declaration from the task exactly: sizes are int64_t there"),
    ("option mismatch", "inlining failed in call to 'always_inline' '_mm512_add_ps': target specific option "
     "mismatch", "inlining failed in call to 'always_inline' '_mm256_max_ps': target specific option mismatch",
     "wide SIMD without flags", "the build lacked the ISA switch; adding it to flags resolved the inlining"),
    ("vector width cast", "incompatible types when initializing type '__m256' using type '__m128'",
     "incompatible types when initializing type '__m512' using type '__m256'", "mixed register widths",
     "widen the narrower register with the cast intrinsic instead of plain assignment"),
    ("lvalue", "lvalue required as left operand of assignment", "lvalue required as left operand of assignment",
     "pointer arithmetic in a macro", "the macro expanded to an expression; assign through a temporary instead"),
    ("subscript", "subscripted value is neither array nor pointer nor vector",
     "subscripted value is neither array nor pointer nor vector", "indexing a scalar accumulator",
     "the accumulator became a plain float after the refactor; index the array, not the running sum"),
    ("too many arguments", "too many arguments to function 'horizontal_sum'",
     "too many arguments to function 'reduce_lanes'", "a helper for the tail",
     "the helper's declaration lagged behind its definition; declare it once, above its first use"),
    ("variable-sized init", "variable-sized object may not be initialized",
     "variable-sized object may not be initialized", "a stack buffer sized by n",
     "size the buffer with a constant or fill it with a loop after declaring it"),
)
GENERAL: tuple[tuple[str, str, str], ...] = (
    ("-O3 -march=native", "Starting every kernel at -O3 -march=native let the compiler vectorise most loops",
     "which compiler options to begin with on a new kernel"),
    ("restrict pointers", "Marking the array arguments restrict removed the aliasing checks gcc added",
     "the compiler assumes arrays overlap, how to tell it they do not"),
    ("check the roofline first", "Comparing against the memory roofline showed the kernel was bandwidth bound",
     "how to tell if it is limited by memory or compute"),
)
SLIPS = ("expected ';' before '}' token", "'i' undeclared (first use in this function)",
         "too few arguments to function 'expf'", "invalid operands to binary * (have 'float *' and 'float')",
         "stray '\\342' in program", "unknown type name 'int64'", "assignment of read-only location '*x'")
GENERAL_NOISE = ("remember to run the tests after every change", "profile twice, the machine is noisy",
                 "kept the baseline as the parent", "session ended early", "the agent retried the same idea",
                 "numbers looked odd on a busy machine", "wrote this down for the next run", "no further ideas")
TWEAKS = ("-funroll-loops", "-O3 instead of -O2", "aligned loads", "const qualifiers", "a local copy of n",
          "size_t indices", "likely hints", "-fno-trapping-math", "moving the bounds check", "inline keyword")


@dataclass
class Query:
    qid: str
    kind: QueryKind
    text: str
    task_id: str
    hardware: str
    relevant: set[str]
    must_not_lead: set[str] = field(default_factory=set)
    phase: str | None = None


@dataclass
class Corpus:
    lessons: list[dict]
    queries: list[Query]
    tasks: list[dict]
    sessions: list[dict] = field(default_factory=list)
    attempts: list[dict] = field(default_factory=list)  # parents before children

    def write(self, path: Path, order: str = "as generated", seed: int = 0, seal: HomeSeal | None = None) -> None:
        """The kope-memory import file; ``order``: 'as generated', 'newest first', 'oldest first', 'shuffled';
        ``seal``: the home it is written for (its key makes the corpus that home's own, as its export would be)."""
        lessons = list(self.lessons)
        if order == "newest first":
            lessons.sort(key=lambda x: x["created_at"], reverse=True)
        elif order == "oldest first":
            lessons.sort(key=lambda x: x["created_at"])
        elif order == "shuffled":
            random.Random(seed).shuffle(lessons)
        with path.open("w", encoding="utf-8") as fh:
            fh.write(json.dumps({"kind": "header", "format": "kope-memory", "version": 1, "home_id": CORPUS_HOME,
                                 "exported_at": "2026-11-30T00:00:00Z", "counts": {}, "sealed": seal is not None})
                     + "\n")
            arch, model, cores, isa = HERE.split("/")
            hardware = {"key": HERE, "arch": arch, "cpu_model": model, "cores": int(cores.rstrip("c")),
                        "isa": json.dumps([isa]), "caches": "{}"}
            records = [*(("task", t) for t in self.tasks), ("hardware", hardware),
                       *(("session", x) for x in self.sessions), *(("attempt", a) for a in self.attempts),
                       *(("lesson", x) for x in lessons)]
            for kind, data in records:
                fh.write(export_line(kind, data, seal) + "\n")


# The corpus stands for a home's own memory: loaded with this id as the home's, its measurements count as made here.
CORPUS_HOME = "retrieval-corpus"


def generate(size: int, seed: int = 7, attempts: int = 0) -> Corpus:
    """About ``size`` lessons (ground truth plus noise) and the queries that have answers in them; with ``attempts``,
    about that many more attempts as noise (sessions of compiles, tests and slips, nothing measured)."""
    rng = random.Random(seed)
    registry = TaskRegistry.default()
    tasks = [t for t in registry.list()]
    family_of = {t.id: t.spec.family for t in tasks}
    known = [t.id for t in tasks if t.spec.family not in UNSEEN_FAMILIES]
    clock = _Clock(rng)
    lessons: list[dict] = []
    queries: list[Query] = []

    def lesson(text: str, strategy: str, label: str, *, task: str | None, hw: str | None,
               speedup: float | None = None, attempt: str | None = None) -> str:
        lid = f"x-{rng.randrange(16**12):012x}"  # random, as real ids are: no order to exploit
        lessons.append({
            "lesson_id": lid, "text": text, "strategy": strategy, "task_id": task,
            "family": family_of.get(task) if task else None, "hardware_key": hw, "target": "c" if attempt else None,
            "attempt_id": attempt, "verified": speedup is not None, "label": label,
            "step_ratio": speedup, "speedup": speedup, "confidence": 0.9 if speedup is not None else 0.3,
            "agent": rng.choice(("claude-desktop 1.4", "cursor 0.52", "kope-bench 1")), "created_at": clock.next(),
        })
        return lid

    # Ground truth: the best measured strategies per task and hardware.
    wins: dict[tuple[str, str], list[tuple[str, Strategy]]] = {}
    pairs = [(t, hw) for t in rng.sample(known, min(len(known), 24)) for hw in HARDWARE]
    for task, hw in pairs:
        kind = HARDWARE[hw]
        usable = [s for s in STRATEGIES if (s.gpu if kind == "gpu" else s.cpu)[1] > 0]
        for strategy in rng.sample(usable, 2):
            low, high = strategy.gpu if kind == "gpu" else strategy.cpu
            x = round(rng.uniform(max(low, 1.3), high), 2)
            text = rng.choice(strategy.lesson).format(task=task, x=x) + f" on {hw.split('/')[1]}"
            wins.setdefault((task, hw), []).append((lesson(text, strategy.name, "effective", task=task, hw=hw,
                                                           speedup=x), strategy))
    pitfalls = {}
    for task, hw in rng.sample(pairs, len(pairs) // 2):
        name, template, asked = rng.choice(PITFALLS)
        x = round(rng.uniform(0.5, 0.84), 2)
        label = "incorrect" if "wrong" in template else "negative"
        pitfalls[(task, hw)] = (lesson(template.format(task=task, x=x), name, label, task=task, hw=hw,
                                       speedup=None if label == "incorrect" else x), asked)
    fixes = {}
    for name, text, error in FIXES:
        task = rng.choice(known)
        fixes[name] = (lesson(text, name, "compile_error", task=task, hw=HERE), error, task)
    general = {name: (lesson(text, name, "lesson", task=None, hw=None), asked) for name, text, asked in GENERAL}
    sessions: list[dict] = []
    attempt_rows: list[dict] = []
    transfers = {}
    for name, recorded, asked, tried, text in ERROR_TRANSFERS:
        task = rng.choice(known)
        failed = _error_and_fix(rng, clock, task, family_of[task], recorded, tried, name, sessions, attempt_rows)
        transfers[name] = (failed, lesson(text, name, "compile_error", task=task, hw=HERE, attempt=failed), asked,
                           task)

    # Noise: what makes retrieval hard (same task and hardware named, measured but within noise; filler).
    while len(lessons) < size:
        roll = rng.random()
        task, hw = rng.choice(pairs) if roll < 0.5 else (rng.choice(known), rng.choice(list(HARDWARE)))
        tweak = rng.choice(TWEAKS)
        if roll < 0.65:
            x = round(rng.uniform(1.0, 1.04), 2)
            lesson(f"{tweak} on {task} ({hw}): {x}x, within noise", tweak, "partial", task=task, hw=hw, speedup=x)
        elif roll < 0.72:  # modest real wins: what worked, but not the best
            x = round(rng.uniform(1.06, 1.25), 2)
            lesson(f"{tweak} helped {task} a little on {hw}: {x}x", tweak, "effective", task=task, hw=hw, speedup=x)
        elif roll < 0.76:  # other compile errors and their fixes
            slip = rng.choice(SLIPS)
            lesson(f"{slip} in {task}; fixed the typo", "fix a typo", "compile_error", task=task, hw=hw)
        elif roll < 0.8:  # general remarks that are no answer to anything
            lesson(rng.choice(GENERAL_NOISE), "note", "lesson", task=None, hw=None)
        elif roll < 0.9:
            lesson(rng.choice(("tried it, no change", "ok", "same as before", "did not matter", "see above")),
                   tweak, "lesson", task=task, hw=hw)
        else:
            x = round(rng.uniform(0.9, 0.99), 2)
            lesson(f"{tweak} made {task} slightly slower on {hw}: {x}x", tweak, "ineffective", task=task, hw=hw,
                   speedup=x)

    # Drawn from a generator of their own: the same lessons and questions with and without them.
    noise = random.Random(seed + 1)
    _noise_attempts(noise, _Clock(noise), attempts, [(t, family_of[t]) for t in known], sessions, attempt_rows)

    # Queries, as an agent asks them.
    cpu_pairs = [(t, hw) for (t, hw) in wins if HARDWARE[hw] == "cpu"]
    for i, (task, hw) in enumerate(rng.sample([p for p in cpu_pairs if p[1] == HERE], 10)):
        lid, strategy = wins[(task, hw)][0]
        queries.append(Query(f"p{i}", "paraphrase", rng.choice(strategy.asked), task, hw, {lid}))
    for i, (task, hw) in enumerate(rng.sample(cpu_pairs, 10)):
        text = rng.choice(("{t} is too slow on this box, where do I start?",
                           "any proven trick to make {t} faster here?", "what gives the biggest gain for {t}?"))
        queries.append(Query(f"n{i}", "natural", text.format(t=task.replace("_", " ")), task, hw,
                             {lid for lid, _ in wins[(task, hw)]}, _other_kind(wins, task, hw)))
    for i, (lid, error, origin) in enumerate(fixes.values()):
        elsewhere = rng.choice([t for t in known if family_of[t] != family_of[origin]])
        pasted = error.format(file="kernel.c", line=rng.randrange(10, 90))
        queries.append(Query(f"e{i}", "compile_error", pasted, elsewhere, HERE, {lid}, phase="compile_error"))
        queries.append(Query(f"e{i}b", "compile_error", f"gcc says:\n{pasted}\nhow do I fix this?", elsewhere,
                             HERE, {lid}, phase="compile_error"))
    for i, (failed, lid, asked, origin) in enumerate(transfers.values()):
        elsewhere = rng.choice([t for t in known if family_of[t] != family_of[origin]])
        pasted = f"kernel.c:{rng.randrange(10, 90)}:{rng.randrange(2, 30)}: error: {asked}"
        question = rng.choice(("{e}", "compile failed:\n{e}", "gcc says:\n{e}\nhow do I fix this?"))
        queries.append(Query(f"t{i}", "error_elsewhere", question.format(e=pasted), elsewhere, HERE,
                             {failed, lid}, phase="compile_error"))
    for i, task in enumerate(rng.sample(sorted({t for t, _ in wins}), 8)):
        nearby = {lid for (t, hw), found in wins.items() if t == task and hw.split("/")[0] == NEW_MACHINE.split("/")[0]
                  for lid, _ in found}
        text = rng.choice(("first run of {t} on this machine: what should I try?",
                           "nothing measured here for {t} yet, what is worth trying first?"))
        queries.append(Query(f"h{i}", "nothing_here_yet", text.format(t=task), task, NEW_MACHINE, nearby,
                             _other_kind(wins, task, HERE)))
    unseen = [t.id for t in tasks if t.spec.family in UNSEEN_FAMILIES]
    for i, (lid, asked) in enumerate(general.values()):
        for j, task in enumerate(rng.sample(unseen, 2)):
            queries.append(Query(f"u{i}{j}", "unseen_family", asked, task, HERE, {lid}))
    for i, (task, hw) in enumerate(rng.sample([p for p in cpu_pairs if p[1] == HERE], 8)):
        text = rng.choice(("what worked for {t} on this hardware?", "which optimisations paid off for {t} here?"))
        queries.append(Query(f"w{i}", "what_worked_here", text.format(t=task), task, hw,
                             {lid for lid, _ in wins[(task, hw)]}, _other_kind(wins, task, hw)))
    with_wins = {t for t, _ in wins}
    for i, task in enumerate(rng.sample([t for t in known if t not in with_wins
                                         and any(family_of[w] == family_of[t] for w in with_wins)], 6)):
        family_wins = {lid for (t, hw), found in wins.items() if hw == HERE and family_of[t] == family_of[task]
                       for lid, _ in found}
        gpu_wins = {lid for (t, hw), found in wins.items() if HARDWARE[hw] == "gpu" and family_of[t] == family_of[task]
                    for lid, _ in found}
        queries.append(Query(f"f{i}", "what_worked_family", f"nothing recorded for {task} yet: what worked for "
                             f"similar {family_of[task]} kernels on this machine?", task, HERE, family_wins, gpu_wins))
    others = [(t, hw) for (t, hw) in wins if hw != HERE]
    for i, (task, hw) in enumerate(rng.sample(others, 8)):
        text = f"what worked for {task} on {hw.split('/')[1]}?"
        queries.append(Query(f"o{i}", "what_worked_other_hw", text, task, hw,
                             {lid for lid, _ in wins[(task, hw)]}, _other_kind(wins, task, hw)))
    task_rows = [{"id": t.id, "family": t.spec.family, "level": t.spec.level, "summary": t.spec.summary}
                 for t in tasks]
    return Corpus(lessons=lessons, queries=queries, tasks=task_rows, sessions=sessions, attempts=attempt_rows)


def _error_and_fix(rng: random.Random, clock: _Clock, task: str, family: str, message: str, tried: str, fix: str,
                   sessions: list[dict], attempts: list[dict]) -> str:
    """A session where an attempt failed to compile with ``message`` and the next one, its child, compiled and
    passed: the pair query_experience offers as an error and its fix; the failed attempt's id."""
    session = f"s-{rng.randrange(16**12):012x}"
    created = clock.next()
    sessions.append(SessionRecord(session_id=session, task_id=task, hardware_key=HERE, created_at=created,
                                  agent=AgentInfo(name="claude-desktop", version="1.4")).model_dump())
    failed, fixed = (f"k-{rng.randrange(16**12):012x}" for _ in range(2))
    common = {"session_id": session, "task_id": task, "family": family, "hardware_key": HERE, "target": "c",
              "flags": ["-O3"], "created_at": created, "agent": "claude-desktop 1.4"}
    attempts.append(AttemptRecord(kernel_id=failed, build_hash="", source_hash=f"{rng.randrange(16**16):016x}",
                                  ok=False, strategy=tried, error_signature=compile_signature(message),
                                  diagnostics_digest=f"12:5 {message}", label="compile_error",
                                  **common).model_dump())
    attempts.append(AttemptRecord(kernel_id=fixed, build_hash=f"{rng.randrange(16**16):016x}",
                                  source_hash=f"{rng.randrange(16**16):016x}", ok=True, parent_id=failed,
                                  strategy=fix, tested=True, correct=True, **common).model_dump())
    return failed


def _noise_attempts(rng: random.Random, clock: _Clock, count: int, tasks: list[tuple[str, str]], sessions: list[dict],
                    attempts: list[dict]) -> None:
    """``count`` attempts in sessions of 1-40 on one task, on this machine (the export names no other): each the
    child of the one before, most compiled and tested but never profiled, some with a slip the next one fixed.
    Plain dicts in the export's form (a million pydantic records took minutes to build)."""
    template = AttemptRecord(kernel_id="", session_id="", task_id="", family="", hardware_key=HERE, target="c",
                             build_hash="", source_hash="", flags=["-O3", "-march=native"], ok=True, created_at="",
                             agent="kope-bench 1").model_dump()
    made = 0
    while made < count:
        task, family = rng.choice(tasks)
        hw = HERE
        session = f"s-{rng.randrange(16**12):012x}"
        created = clock.next()
        sessions.append(SessionRecord(session_id=session, task_id=task, hardware_key=hw, created_at=created,
                                      agent=AgentInfo(name="kope-bench", version="1")).model_dump())
        parent = None
        for step in range(min(count - made, rng.randint(1, 40))):
            kernel = f"k-{rng.randrange(16**12):012x}"
            slip = rng.choice(SLIPS) if rng.random() < 0.15 else None
            tweak = rng.choice(TWEAKS)
            source = (f"#include <stdint.h>\n// {task}, step {step}: {tweak}\nvoid kernel(const float *restrict x, "
                      f"float *restrict y, int64_t n) {{\n  for (int64_t i = 0; i < n; i++) y[i] = x[i] * "
                      f"{rng.random():.6f}f;\n}}\n" * 3)
            attempts.append(template | {
                "kernel_id": kernel, "session_id": session, "task_id": task, "family": family, "hardware_key": hw,
                "build_hash": "" if slip else f"{rng.randrange(16**16):016x}", "source": source,
                "source_hash": f"{rng.randrange(16**16):016x}", "ok": slip is None, "parent_id": parent,
                "strategy": tweak, "created_at": created, "error_signature": compile_signature(slip) if slip else None,
                "diagnostics_digest": f"7:3 {slip}" if slip else "", "tested": slip is None,
                "correct": True if slip is None else None, "label": "compile_error" if slip else "unmeasured"})
            parent = kernel
            made += 1


def _other_kind(wins: dict[tuple[str, str], list[tuple[str, Strategy]]], task: str, hw: str) -> set[str]:
    """Wins for the same task on the other kind of hardware (a GPU win first for a CPU question is wrong)."""
    return {lid for (t, h), found in wins.items() if t == task and HARDWARE[h] != HARDWARE[hw]
            for lid, _ in found}


class _Clock:
    """Creation times spread over a month, in random order relative to relevance."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def next(self) -> str:
        day, second = self.rng.randrange(1, 29), self.rng.randrange(86_400)
        return f"2026-11-{day:02d}T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}.000+00:00"


def kinds(queries: list[Query]) -> Iterator[QueryKind]:
    yield from dict.fromkeys(q.kind for q in queries)
