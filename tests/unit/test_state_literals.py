"""The SQL and the state enums agree: every state literal the SQL uses is an enum value, and the
statements that move runs perform exactly the moves of ``TRANSITIONS``.

The SQL is read, not trusted. For each statement that updates ``runs.state`` the reader below finds
the states it moves runs from (its ``WHERE state ...`` guards and those of the CTEs it reads) and to
(the literals its ``SET state = ...`` can write, a ``CASE`` included). A new move in SQL, a move the
enum allows that no statement performs, a state literal that is not an enum value, or a guard the
reader cannot interpret all fail here. The reader knows just enough SQL for the statements of this
repository; the last tests show it catching each kind of disagreement.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scheduler.domain.run_state import ACTIVE, TRANSITIONS, RunState
from scheduler.domain.schedule import ScheduleState
from scheduler.store.migrate import MIGRATIONS_DIR
from scheduler.store.sql import QUERIES_DIR, parse_blocks

Move = tuple[RunState, RunState]
STATE_TABLES = {"runs": frozenset(RunState), "schedules": frozenset(ScheduleState)}

_P, _D, _R, _W = RunState.PENDING, RunState.DISPATCHED, RunState.RUNNING, RunState.RETRY_WAIT
_OUTCOMES = (RunState.RUNNING, RunState.RETRY_WAIT, RunState.SUCCEEDED, RunState.DEAD)

# What each statement that changes runs.state does, in words and as the reader must find it.
EXPECTED_MOVES: dict[str, frozenset[Move]] = {
    # The scanner, when a retry is due: the next attempt, as pending, with its message.
    "redispatch_runs": frozenset({(_W, _P)}),
    # An operator's dead-letter replay, or redispatch of runs whose messages were lost with Kafka.
    "replay_runs": frozenset({(RunState.DEAD, _P), (_P, _P), (_D, _P)}),
    # The reconciler: an outcome of the current attempt of a run that is not terminal; a start or a
    # heartbeat does not revive a run in retry_wait.
    "apply_outcomes": frozenset(itertools.product(ACTIVE, _OUTCOMES)) - {(_W, _R)},
    # The lease sweeper: only a started run whose worker went silent (waiting never expires a lease).
    "sweep_expired_leases": frozenset(itertools.product((_R,), (_W, RunState.DEAD))),
    # The relay: Kafka refused the job message for good, so the run cannot be dispatched.
    "quarantine_outbox": frozenset({(_P, RunState.DEAD)}),
}


class UnreadableSql(AssertionError):
    """A statement shaped in a way this reader does not interpret: extend the reader, never skip it."""


# --- Reading SQL ---------------------------------------------------------------------------------

# Words that follow a table name without being its alias.
_KEYWORDS = frozenset(
    {
        "on", "where", "join", "using", "order", "limit", "for", "returning", "set", "group", "inner",
        "left", "right", "full", "cross", "union", "select", "values", "with", "skip", "natural",
        "lateral", "having", "window", "offset", "fetch", "and", "or", "not", "then", "when", "else",
        "end", "as", "conflict", "do", "of",
    }
)  # fmt: skip
_SOURCE = re.compile(r"\b(?:from|join|into|update|table)\s+(\w+)|\bon\s+(\w+)\s*\(")
_ALIASED = re.compile(r"\b(?:from|join|update)\s+(\w+)\s+(?:as\s+)?(\w+)")
_CTE = re.compile(r"(?:\bwith|,)\s+(\w+)\s+as\s*\(")
_PREDICATE = re.compile(r"(?:\b(\w+)\.)?\bstate\s*(<>|!=|=|not\s+in\b|in\b)\s*")
_UPDATE = re.compile(r"\bupdate\s+(\w+)")


@dataclass(frozen=True)
class Predicate:
    """``[qualifier.]state <op> <literals>``; ``literals`` is None when the right side is not literal."""

    qualifier: str | None
    negated: bool  # <>, != and not in
    literals: frozenset[str] | None
    position: int


@dataclass
class Statement:
    """One SQL statement: ``text`` without comments and lowercased outside literals, and ``masked``,
    the same with every literal's content blanked, so that structure is found in ``masked`` and
    literals are read from ``text`` at the same positions."""

    name: str
    text: str
    masked: str = field(init=False)
    groups: list[tuple[int, int]] = field(init=False)
    ctes: dict[str, tuple[int, int]] = field(init=False)
    aliases: dict[str, set[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.text, self.masked = _clean(self.text)
        self.groups = _groups(self.masked)
        top = self.depth0(0, len(self.masked))
        self.ctes = {m.group(1): self.group_at(m.end() - 1) for m in _CTE.finditer(top)}
        self.aliases = {}
        for m in _ALIASED.finditer(self.masked):
            if not {m.group(1), m.group(2)} & _KEYWORDS:
                self.aliases.setdefault(m.group(2), set()).add(m.group(1))

    # Structure.

    def group_at(self, open_position: int) -> tuple[int, int]:
        return next(g for g in self.groups if g[0] == open_position)

    def enclosing(self, position: int) -> tuple[int, int]:
        """The innermost parenthesised group around ``position``, or the whole statement."""
        around = [g for g in self.groups if g[0] < position < g[1]]
        return max(around, key=lambda g: g[0]) if around else (-1, len(self.masked))

    def depth0(self, start: int, end: int) -> str:
        """``masked[start:end]`` with the inside of every nested group blanked (positions kept)."""
        chars = list(self.masked[start:end])
        for open_, close in self.groups:
            if start <= open_ and close < end:
                chars[open_ - start + 1 : close - start] = " " * (close - open_ - 1)
        return "".join(chars)

    def literal_at(self, position: int) -> str:
        end = self.masked.index("'", position + 1)
        return self.text[position + 1 : end].replace("''", "'")

    def literals_in(self, start: int, end: int) -> frozenset[str] | None:
        """The literals of a list ``'a', 'b'`` spanning ``text[start:end]``; None if anything else."""
        inside = self.masked[start:end]
        if not re.fullmatch(r"\s*'x*'(?:\s*,\s*'x*')*\s*", inside):
            return None
        return frozenset(self.literal_at(start + m.start()) for m in re.finditer(r"'x*'", inside))

    # Which table a state column belongs to.

    def tables_of(self, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        if name in STATE_TABLES:
            return {name}
        if name in self.ctes and name not in seen:
            body = self.ctes[name]
            seen |= {name}
            found = self.tables_in(body[0] + 1, body[1], seen)
            if len(found) > 1:
                # A CTE joining several tables: its state column is the one it selects by name.
                level = self.depth0(body[0] + 1, body[1])
                named: set[str] = set()
                for qualifier in re.findall(r"\b(\w+)\.state\b", level):
                    for source in self.aliases.get(qualifier, set()) | {qualifier}:
                        named |= self.tables_of(source, seen)
                found = named or found
            return found
        return set()

    def tables_in(self, start: int, end: int, seen: frozenset[str] = frozenset()) -> set[str]:
        """The state-bearing tables the scope reads or writes at its own level."""
        found: set[str] = set()
        for m in _SOURCE.finditer(self.depth0(start, end)):
            found |= self.tables_of(m.group(1) or m.group(2), seen)
        return found

    def table_of(self, qualifier: str | None, position: int) -> str:
        if qualifier is not None:
            names = self.aliases.get(qualifier, set()) | {qualifier}
            tables = set().union(*(self.tables_of(n) for n in names))
        else:
            scope = self.enclosing(position)
            tables = self.tables_in(scope[0] + 1, scope[1])
            while not tables and scope[0] >= 0:
                scope = self.enclosing(scope[0])
                tables = self.tables_in(scope[0] + 1, scope[1])
        if len(tables) != 1:
            raise UnreadableSql(f"{self.name}: state column at {position} belongs to {tables or 'no table'}")
        return tables.pop()

    # State predicates and writes.

    def predicates(self, start: int = 0, end: int | None = None) -> Iterator[Predicate]:
        end = len(self.masked) if end is None else end
        for m in _PREDICATE.finditer(self.masked, start, end):
            op, after = m.group(2), m.end()
            literals: frozenset[str] | None = None
            if op in ("=", "<>", "!=") and self.masked[after] == "'":
                literals = frozenset({self.literal_at(after)})
            elif op not in ("=", "<>", "!=") and self.masked[after] == "(":
                group = self.group_at(after)
                literals = self.literals_in(group[0] + 1, group[1])
            negated = op in ("<>", "!=") or op.startswith("not")
            yield Predicate(m.group(1), negated, literals, m.start())

    def written(self, start: int, end: int) -> tuple[frozenset[str], dict[str, str] | None] | None:
        """The states the expression ``text[start:end]`` can write, and for a ``CASE <x>.kind`` the
        target of each kind (``"*"`` for its ``else``); None when it is not made of literals."""
        expression, masked = self.text[start:end].strip(), self.masked[start:end].strip()
        if re.fullmatch(r"'x*'(?:::\w+)?", masked):
            return frozenset({expression[1 : masked.index("'", 1)]}), None
        if not masked.startswith("case") or not masked.endswith("end"):
            return None
        results = re.findall(r"\b(?:then|else)\s+('x*'|\S+)", masked)
        if any(not r.startswith("'") for r in results):
            return None
        offset = start + len(self.masked[start:end]) - len(self.masked[start:end].lstrip())
        targets = frozenset(
            self.literal_at(offset + m.start(1)) for m in re.finditer(r"\b(?:then|else)\s+('x*')", masked)
        )
        simple = re.match(r"case\s+(\w+\.kind)\s+when\b", masked)
        if simple is None:
            return targets, None
        by_kind = {
            self.literal_at(offset + m.start(1)): self.literal_at(offset + m.start(2))
            for m in re.finditer(r"\bwhen\s+('x*')\s+then\s+('x*')", masked)
        }
        otherwise = re.search(r"\belse\s+('x*')", masked)
        if otherwise is not None:
            by_kind["*"] = self.literal_at(offset + otherwise.start(1))
        return targets, by_kind


def _clean(sql: str) -> tuple[str, str]:
    text: list[str] = []
    masked: list[str] = []
    i = 0
    while i < len(sql):
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            end = len(sql) if end < 0 else end
            text.append(" " * (end - i))
            masked.append(" " * (end - i))
            i = end
        elif sql[i] == "'":
            end = i + 1
            while (end := sql.index("'", end)) + 1 < len(sql) and sql[end + 1] == "'":
                end += 2
            text.append(sql[i : end + 1])
            masked.append("'" + "x" * (end - i - 1) + "'")
            i = end + 1
        else:
            text.append(sql[i].lower())
            masked.append(sql[i].lower())
            i += 1
    return "".join(text), "".join(masked)


def _groups(masked: str) -> list[tuple[int, int]]:
    groups, opened = [], []
    for i, char in enumerate(masked):
        if char == "(":
            opened.append(i)
        elif char == ")":
            groups.append((opened.pop(), i))
    assert not opened, "unbalanced parentheses"
    return groups


def _split_top(statement: Statement, start: int, end: int) -> list[tuple[int, int]]:
    """The spans of ``start:end`` between its depth-0 commas."""
    level, spans, begin = statement.depth0(start, end), [], start
    for i, char in enumerate(level):
        if char == ",":
            spans.append((begin, start + i))
            begin = start + i + 1
    return [*spans, (begin, end)]


# --- What the SQL uses and does ------------------------------------------------------------------


@dataclass(frozen=True)
class Use:
    statement: str
    table: str
    literal: str
    how: str


def uses(statement: Statement) -> Iterator[Use]:
    """Every state literal the statement compares, writes, inserts, constrains or records."""
    for p in statement.predicates():
        for literal in p.literals or ():
            yield Use(statement.name, statement.table_of(p.qualifier, p.position), literal, "compared")
    for m in _UPDATE.finditer(statement.masked):
        update = _update_at(statement, m)
        if update is not None and update.writes is not None:
            for literal in update.writes[0]:
                yield Use(statement.name, update.table, literal, "set")
    for table, literal in _inserted(statement):
        yield Use(statement.name, table, literal, "inserted")
    for m in re.finditer(r"'x{5}'\s*,\s*'", statement.masked):
        if statement.literal_at(m.start()) == "state":
            literal = statement.literal_at(m.end() - 1)
            yield Use(statement.name, statement.table_of(None, m.start()), literal, "recorded as JSON")
    create = re.search(r"\bcreate\s+table\s+(\w+)\s*\(", statement.masked)
    if create is not None and create.group(1) in STATE_TABLES:
        body = statement.group_at(create.end() - 1)
        for column in _split_top(statement, body[0] + 1, body[1]):
            default = re.match(
                r"\s*state\s+text\b.*?\bdefault\s+'", statement.masked[column[0] : column[1]], re.S
            )
            if default is not None:
                literal = statement.literal_at(column[0] + default.end() - 1)
                yield Use(statement.name, create.group(1), literal, "default")


def _inserted(statement: Statement) -> Iterator[tuple[str, str]]:
    """Literal states an ``INSERT INTO runs|schedules (columns) VALUES|SELECT ...`` writes."""
    for m in re.finditer(r"\binsert\s+into\s+(\w+)\s*\(", statement.masked):
        table = m.group(1)
        if table not in STATE_TABLES:
            continue
        columns = statement.group_at(m.end() - 1)
        names = [statement.masked[a:b].strip() for a, b in _split_top(statement, columns[0] + 1, columns[1])]
        rest = statement.masked[columns[1] + 1 :]
        after = columns[1] + 1 + len(rest) - len(rest.lstrip())
        if statement.masked.startswith("values", after):
            values = statement.group_at(statement.masked.index("(", after))
            items = _split_top(statement, values[0] + 1, values[1])
        elif statement.masked.startswith("select", after):
            scope = statement.enclosing(after)
            level = statement.depth0(after, scope[1])
            stop = re.search(r"\bfrom\b", level)
            items = _split_top(
                statement, after + len("select"), after + (stop.start() if stop else len(level))
            )
        else:
            raise UnreadableSql(f"{statement.name}: insert into {table} without values or select")
        for column, item in zip(names, items, strict=True):
            if column == "state":
                written = statement.written(*item)
                yield from ((table, literal) for literal in (written[0] if written else ()))


@dataclass(frozen=True)
class Update:
    table: str
    writes: tuple[frozenset[str], dict[str, str] | None] | None  # None: no state assignment
    guards: list[Predicate]
    exclusions: list[tuple[frozenset[str], str]]  # not (<x>.kind in (kinds) and <r>.state = 'S')


def _update_at(statement: Statement, m: re.Match[str]) -> Update | None:
    if statement.masked[: m.start()].rstrip().endswith("for"):
        return None  # FOR UPDATE: a lock, not a statement
    tables = statement.tables_of(m.group(1))
    if not tables:
        return None
    table = tables.pop()
    scope = statement.enclosing(m.start())
    base = scope[0] + 1
    level = statement.depth0(base, scope[1])
    set_ = re.compile(r"\bset\b").search(level, m.end() - base)
    assert set_ is not None, f"{statement.name}: update without set"

    def clause(keyword: str) -> int | None:
        found = re.compile(rf"\b{keyword}\b").search(level, set_.end())
        return None if found is None else base + found.start()

    where, returning = clause("where"), clause("returning")
    ends = [p for p in (clause("from"), where, returning) if p is not None]
    writes = None
    for a, b in _split_top(statement, base + set_.end(), min([*ends, scope[1]])):
        assignment = re.match(r"\s*state\s*=", statement.masked[a:b])
        if assignment is not None:
            writes = statement.written(a + assignment.end(), b)
            # Schedules change state by the caller's decision (pause, resume, complete); a run's
            # moves are the SQL's own, so they must be literals to be checked.
            if writes is None and table == "runs":
                raise UnreadableSql(f"{statement.name}: runs.state is set from something other than literals")
    where_end = returning if returning is not None else scope[1]
    guards: list[Predicate] = []
    exclusions: list[tuple[frozenset[str], str]] = []
    if where is not None:
        _read_guards(statement, where, where_end, guards, exclusions)
    sources_text = statement.masked[base + set_.end() : where_end]
    for name in _read_ctes(statement, sources_text, frozenset()):
        body = statement.ctes[name]
        body_level = statement.depth0(body[0] + 1, body[1])
        body_where = re.search(r"\bwhere\b", body_level)
        if body_where is not None:
            _read_guards(statement, body[0] + 1 + body_where.start(), body[1], guards, exclusions)
    return Update(table, writes, guards, exclusions)


def _read_ctes(statement: Statement, text: str, seen: frozenset[str]) -> set[str]:
    """The CTEs ``text`` reads, and the CTEs those read, transitively."""
    found: set[str] = set()
    for m in re.finditer(r"\b(?:from|join)\s+(\w+)", text):
        name = m.group(1)
        if name in statement.ctes and name not in seen | found:
            found.add(name)
            body = statement.ctes[name]
            found |= _read_ctes(statement, statement.masked[body[0] + 1 : body[1]], seen | found)
    return found


def _read_guards(
    statement: Statement,
    start: int,
    end: int,
    guards: list[Predicate],
    exclusions: list[tuple[frozenset[str], str]],
) -> None:
    for p in statement.predicates(start, end):
        if statement.table_of(p.qualifier, p.position) != "runs":
            continue
        group = statement.enclosing(p.position)
        before = statement.masked[: max(group[0], 0)].rstrip()
        if group[0] > start and before.endswith("exists"):
            continue  # a condition on other rows of runs, not on the row being moved
        if group[0] > start and re.search(r"\bnot$", before):
            exclusions.append(_exclusion(statement, group))
            continue
        if p.literals is None:
            raise UnreadableSql(f"{statement.name}: a state guard compares with a non-literal")
        level = statement.depth0(group[0] + 1, group[1]) if group[0] > start else statement.depth0(start, end)
        if re.search(r"\bor\b", level):
            raise UnreadableSql(f"{statement.name}: a state guard inside an OR")
        guards.append(p)


def _exclusion(statement: Statement, group: tuple[int, int]) -> tuple[frozenset[str], str]:
    inside = statement.masked[group[0] + 1 : group[1]]
    m = re.fullmatch(r"\s*\w+\.kind\s+in\s*\((.*?)\)\s+and\s+\w+\.state\s*=\s*('x*')\s*", inside, re.S)
    if m is None:
        raise UnreadableSql(f"{statement.name}: a NOT (...) around a state guard of an unknown shape")
    kinds = statement.literals_in(group[0] + 1 + m.start(1), group[0] + 1 + m.end(1))
    assert kinds is not None
    return kinds, statement.literal_at(group[0] + 1 + m.start(2))


def moves(statement: Statement, kinds: frozenset[str]) -> frozenset[Move]:
    """The run moves the statement performs; ``kinds`` are all the outcome kinds there are."""
    found: set[Move] = set()
    for m in _UPDATE.finditer(statement.masked):
        update = _update_at(statement, m)
        if update is None or update.table != "runs" or update.writes is None:
            continue
        sources = set(RunState)
        for guard in update.guards:
            assert guard.literals is not None
            states = {RunState(s) for s in guard.literals}
            sources = sources - states if guard.negated else sources & states
        targets, by_kind = update.writes
        performed = set(itertools.product(sources, (RunState(t) for t in targets)))
        for excluded_kinds, state in update.exclusions:
            if by_kind is None:
                raise UnreadableSql(f"{statement.name}: a kind-conditioned guard without a CASE on the kind")
            named = set(by_kind) - {"*"}
            for target in targets:
                reaching = {k for k, t in by_kind.items() if t == target and k != "*"}
                if by_kind.get("*") == target:
                    reaching |= kinds - named
                if reaching <= excluded_kinds:
                    performed.discard((RunState(state), RunState(target)))
        found |= performed
    return frozenset(found)


# --- The repository's SQL -------------------------------------------------------------------------


def _migration_statements() -> list[Statement]:
    statements: list[Statement] = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        text, masked = _clean(path.read_text())
        begin = 0
        for i, char in enumerate(masked + ";"):
            if char == ";":
                if masked[begin:i].strip():
                    statements.append(Statement(f"{path.name}#{len(statements)}", text[begin:i]))
                begin = i + 1
    return statements


QUERIES = [
    Statement(name, sql)
    for path in sorted(QUERIES_DIR.glob("*.sql"))
    for name, sql in parse_blocks(path.read_text()).items()
]
MIGRATIONS = _migration_statements()


def check_constraint(table: str, column: str) -> frozenset[str]:
    """The values the migrations' last ``check (column in (...))`` on ``table`` admits."""
    admitted: frozenset[str] | None = None
    for statement in MIGRATIONS:
        if re.search(rf"\b(?:create|alter)\s+table\s+{table}\b", statement.masked) is None:
            continue
        for m in re.finditer(rf"\bcheck\s*\(\s*{column}\s+in\s*\(", statement.masked):
            group = statement.group_at(m.end() - 1)
            admitted = statement.literals_in(group[0] + 1, group[1]) or admitted
    assert admitted is not None, f"no check constraint on {table}.{column}"
    return admitted


OUTCOME_KINDS = check_constraint("attempts", "kind")


def test_every_state_literal_in_the_sql_is_a_state_of_its_table() -> None:
    found = [use for statement in QUERIES + MIGRATIONS for use in uses(statement)]
    wrong = [u for u in found if u.literal not in STATE_TABLES[u.table]]
    assert wrong == []
    # The reader found the literals this repository is known to use, so it is looking at all of them.
    assert {(u.table, u.how) for u in found} >= {
        ("runs", "compared"), ("runs", "set"), ("runs", "recorded as JSON"),
        ("schedules", "compared"), ("schedules", "inserted"), ("schedules", "default"),
    }  # fmt: skip


def test_the_tables_admit_exactly_the_enum_states() -> None:
    assert check_constraint("runs", "state") == {s.value for s in RunState}
    assert check_constraint("schedules", "state") == {s.value for s in ScheduleState}


def test_each_statement_moves_runs_as_its_table_entry_says() -> None:
    performed = {s.name: moves(s, OUTCOME_KINDS) for s in QUERIES}
    assert {name: found for name, found in performed.items() if found} == EXPECTED_MOVES


def test_the_sql_performs_exactly_the_moves_the_state_machine_allows() -> None:
    performed: set[Move] = set().union(*(moves(s, OUTCOME_KINDS) for s in QUERIES))
    allowed = {(current, target) for current, targets in TRANSITIONS.items() for target in targets}
    assert performed - allowed == set(), "the SQL makes moves the state machine forbids"
    assert allowed - performed == set(), "the state machine allows moves no SQL makes"


# --- The reader catches what it must --------------------------------------------------------------


def test_the_reader_sees_a_new_move() -> None:
    sql = Statement(
        "cancel", "update runs r set state = 'cancelled' where r.state in ('pending', 'dispatched')"
    )
    assert moves(sql, OUTCOME_KINDS) == {(_P, RunState.CANCELLED), (_D, RunState.CANCELLED)}


def test_the_reader_follows_guards_into_ctes_and_reads_case_results() -> None:
    sql = Statement(
        "sweep",
        """with due as (select r.id from runs r where r.state not in ('succeeded', 'dead', 'skipped',
                                                                     'cancelled', 'retry_wait'))
           update runs r set state = case when r.attempt > 3 then 'dead' else 'retry_wait' end
             from due d where r.id = d.id""",
    )
    assert moves(sql, OUTCOME_KINDS) == set(itertools.product((_P, _D, _R), (RunState.DEAD, _W)))


def test_the_reader_applies_a_kind_conditioned_exclusion() -> None:
    sql = Statement(
        "apply",
        """update runs r set state = case e.kind when 'succeeded' then 'succeeded' else 'running' end
             from event e
            where r.state = 'retry_wait' and not (e.kind in ('started', 'heartbeat', 'retry', 'dead')
                                                 and r.state = 'retry_wait')""",
    )
    assert moves(sql, OUTCOME_KINDS) == {(_W, RunState.SUCCEEDED)}


@pytest.mark.parametrize(
    "sql",
    [
        "select * from runs where state = 'canceled'",
        "select * from schedules s where s.state in ('active', 'errored')",
        "update runs set state = 'done' where state = 'pending'",
        "insert into schedules (id, state) values (%(id)s, 'running')",
    ],
)
def test_the_reader_finds_a_misspelt_state(sql: str) -> None:
    found = list(uses(Statement("typo", sql)))
    assert [u for u in found if u.literal not in STATE_TABLES[u.table]] != []


@pytest.mark.parametrize(
    "sql",
    [
        "update runs set state = 'dead' where state = 'running' or state = 'pending'",
        "update runs set state = %(state)s where state = 'pending'",
        "update runs set state = 'dead' where not (state = 'running' and attempt > 1)",
    ],
)
def test_the_reader_refuses_what_it_cannot_interpret(sql: str) -> None:
    with pytest.raises(UnreadableSql):
        moves(Statement("odd", sql), OUTCOME_KINDS)


def test_the_file_lists_are_not_empty() -> None:
    assert QUERIES and MIGRATIONS and Path(QUERIES_DIR).is_dir()
