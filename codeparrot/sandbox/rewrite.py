"""The test as the trusted checker runs it: every call happens whatever the candidate answers (stdlib only).

A test stopped at its first failing assertion is an oracle: a program called again knows its last answer
was accepted, and samples of one task, which run side by side, could teach each other the answers one call
at a time. So `record_all` rewrites the test before the checker runs it:
- every `assert TEST, MESSAGE` outside a `try` or `with` block becomes
  `_codeparrot_assert(TEST, "AssertionError: <source>", lambda: MESSAGE)`, which records a failure instead
  of raising. The message is evaluated only after the last call, on the values its names had at the first
  failure (formatting a wrong answer while calls remain would be a clock the program could read), and
  never when it calls anything: a message may call the candidate (HumanEval/77, 78, 95, 97, 117 and 148
  do: `'First test error: ' + str(candidate(1))`), which would add calls exactly when an answer is wrong.
  Such a message shows as its source text;
- every statement of `check()` (and, inside its `for`/`while`/`if` blocks, every statement of theirs) runs
  under `try: ... except Exception: _codeparrot_record(error)`, so an exception (the candidate's own,
  re-raised by the checker, or one of the test's) is recorded and the next statement still runs. `try` and
  `with` statements are guarded whole, never inside: their handlers may expect the exception.
The check fails when anything was recorded, after the last call; before the first failure both versions
run the same code, so the verdict is the original test's. The checker's exceptions for a program that
broke the protocol are BaseExceptions and still end the check at once.

What the rewriting cannot make answer-independent is named by `answer_dependent`: branches, loops,
`and`/`or`, conditional expressions and `all()`/`any()` over generators whose condition depends on an answer
and which decide whether code runs, assertions inside `try`/`with` blocks, and a `check` that is not a
plain function. Each result of such a test names them in its `checker` field; HumanEval's 164 tests have
none of them.
"""

import ast
import re

ASSERT, RECORD, EXCEPTION = "_codeparrot_assert", "_codeparrot_record", "_codeparrot_exception"
_ERROR = "_codeparrot_error"
_KEEP = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Return, ast.Break, ast.Continue, ast.Pass,
         ast.Global, ast.Nonlocal)
_BLOCKS = (ast.Try, ast.With, ast.AsyncWith) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


class _Asserts:
    """`assert T, M` -> `_codeparrot_assert(T, detail[, lambda: M])`, except inside try/with blocks. Asserts
    are statements: only statement lists are walked (an ast.NodeTransformer would visit every expression)."""

    def __init__(self, text: str):
        # Lines split once, as the parser counts them (ast.get_source_segment splits the text at each call,
        # and ast.unparse costs more than compiling the whole test).
        self.lines = [line.encode() for line in re.split(r"(?<=\r\n)|(?<=\r)(?!\n)|(?<=\n)", text)]

    def _source(self, node) -> str:
        """The node's own text, a slice of the test (positions are UTF-8 byte offsets)."""
        try:
            first, last = node.lineno - 1, node.end_lineno - 1
            if first == last:
                data = self.lines[first][node.col_offset:node.end_col_offset]
            else:
                data = b"".join([self.lines[first][node.col_offset:], *self.lines[first + 1:last],
                                 self.lines[last][:node.end_col_offset]])
            segment = data.decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - a detail, never a reason to fail the rewriting
            segment = "<expression>"
        return " ".join(segment.split())[:300]

    def body(self, statements: list) -> list:
        out = []
        for stmt in statements:
            if isinstance(stmt, ast.Assert):
                stmt = self.assertion(stmt)
            elif not isinstance(stmt, _BLOCKS):  # try/with: their handlers may expect the AssertionError
                for field in ("body", "orelse"):
                    block = getattr(stmt, field, None)
                    if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                        setattr(stmt, field, self.body(block))
                for case in getattr(stmt, "cases", ()):  # match statements
                    case.body = self.body(case.body)
            out.append(stmt)
        return out

    def assertion(self, node):
        args = [node.test]
        if node.msg is None:
            args.append(ast.Constant("AssertionError: assert " + self._source(node.test)))
        elif isinstance(node.msg, ast.Constant):
            args.append(ast.Constant("AssertionError: " + str(node.msg.value)))
        else:
            args.append(ast.Constant("AssertionError: " + self._source(node.msg)))
            if not any(isinstance(n, (ast.Call, ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr, ast.Lambda))
                       for n in ast.walk(node.msg)):
                args.append(ast.Lambda(ast.arguments([], [], None, [], [], None, []), node.msg))
        return _located(ast.Expr(ast.Call(ast.Name(ASSERT, ast.Load()), args, [])), node)


def _located(new, ref):
    """`new` with `ref`'s position on it and on every node of it that has none (the nodes of the test it
    holds keep theirs: ast.fix_missing_locations would walk the whole test again)."""
    todo = [new]
    while todo:
        node = todo.pop()
        if "lineno" in node._attributes and getattr(node, "lineno", None) is not None and node is not new:
            continue
        for name in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if name in node._attributes:
                setattr(node, name, getattr(ref, name, 0))
        todo.extend(ast.iter_child_nodes(node))
    return new


def _guarded(body: list) -> list:
    """Each statement of `body` under a recording `except`, blocks of loops and branches too."""
    out = []
    for stmt in body:
        if isinstance(stmt, _KEEP):
            out.append(stmt)
            continue
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.If)):
            stmt.body, stmt.orelse = _guarded(stmt.body), _guarded(stmt.orelse)
        record = ast.Expr(ast.Call(ast.Name(RECORD, ast.Load()), [ast.Name(_ERROR, ast.Load())], []))
        handler = ast.ExceptHandler(ast.Name(EXCEPTION, ast.Load()), _ERROR, [record])
        out.append(_located(ast.Try([stmt], [handler], [], []), stmt))
    return out


def record_all(test: str, filename: str = "<test>"):
    """The test's code, rewritten as above (SyntaxError for a test that does not compile)."""
    return prepare(test, filename)[0]


def prepare(test: str, filename: str = "<test>") -> tuple:
    """(the test's code rewritten as above, `answer_dependent`'s list) from one parse of the test (raises
    SyntaxError for a test that does not compile)."""
    tree = ast.parse(test, filename)
    notes = _answer_dependent(tree) if _MAYBE_CONTROL.search(test) else []
    tree.body = _Asserts(test).body(tree.body)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            node.body = _guarded(node.body)
    return compile(tree, filename, "exec"), notes


def _calls_candidate(node, tainted: set) -> bool:
    return any((isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "candidate")
               or (isinstance(n, ast.Name) and n.id in tainted) for n in ast.walk(node))


def _calls(nodes) -> bool:
    return any(isinstance(n, ast.Call) for node in nodes for n in ast.walk(node))


def _tainted_names(tree) -> set:
    """Names that may hold an answer: assigned (to a fixpoint) from an expression that calls the candidate
    or reads such a name."""
    bindings = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            bindings.append((getattr(node, "targets", None) or [node.target], node.value))
        elif isinstance(node, (ast.For, ast.comprehension)):
            bindings.append(([node.target], node.iter))
    tainted, changed = set(), True
    while changed:
        changed = False
        for targets, value in bindings:
            if _calls_candidate(value, tainted):
                names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)} - tainted
                tainted |= names
                changed = changed or bool(names)
    return tainted


def answer_dependent(test: str) -> list:
    """Where the test's calls may still depend on earlier answers ("line N: what"), or [] (see above)."""
    try:
        return _answer_dependent(ast.parse(test))
    except SyntaxError:
        return []


_MAYBE_CONTROL = re.compile(r"\b(?:if|while|and|or|all|any|try|with)\b")  # no such word: nothing to trace
_CONTROL = (ast.If, ast.While, ast.IfExp, ast.BoolOp, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
            ast.Call) + _BLOCKS


def _control(node) -> bool:
    """Could `node` decide whether code runs (the cheap test, before any name is traced)?"""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id in ("all", "any")
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return any(gen.ifs for gen in node.generators)
    return isinstance(node, _CONTROL)


def _answer_dependent(tree) -> list:
    tainted, found = None, []
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        found.append("check is not a plain function: its calls stop at the first failure")
    for node in ast.walk(tree):
        what = None
        if not _control(node):
            continue
        if tainted is None:  # only for a test with control flow at all (most HumanEval tests have none)
            tainted = _tainted_names(tree)
        if isinstance(node, (ast.If, ast.While)) and _calls_candidate(node.test, tainted) \
                and _calls(node.body + node.orelse):
            what = type(node).__name__.lower() + " on an answer"
        elif isinstance(node, ast.IfExp) and _calls_candidate(node.test, tainted) and _calls([node.body, node.orelse]):
            what = "conditional expression on an answer"
        elif isinstance(node, ast.BoolOp) and any(_calls_candidate(v, tainted) and _calls(node.values[i + 1:])
                                                  for i, v in enumerate(node.values[:-1])):
            what = "and/or on an answer"
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) and any(
                _calls_candidate(cond, tainted) for gen in node.generators for cond in gen.ifs):
            what = "comprehension filtered on an answer"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("all", "any") \
                and any(isinstance(a, ast.GeneratorExp) and _calls_candidate(a, tainted) for a in node.args):
            what = f"{node.func.id}() over a generator of answers"
        elif isinstance(node, _BLOCKS) and any(isinstance(n, ast.Assert) for stmt in node.body for n in ast.walk(stmt)):
            what = "assertion inside a try/with block (raises, skipping the rest of the block)"
        if what:
            found.append(f"line {node.lineno}: {what}")
    return found
