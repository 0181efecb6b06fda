"""Every C++ function in csrc/ fits in 80 lines (issue 44): a longer one does several things,
each of which should be a named helper.

The measure is a small brace matcher, not a C++ parser: comments, string and character
literals and preprocessor lines are blanked first, then each ``{`` at namespace or class
scope whose header holds a parameter list opens a function body. A function's length runs
from the first line of its signature to its closing brace, as Python's ``lineno``..``end_lineno``
counts a ``def`` (a ``template <...>`` prefix, like a decorator, is left out). Lambdas and blocks count towards the
function around them.
"""
import bisect
import pathlib
import re

import pytest

MAX_LINES = 80
CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"
SUFFIXES = {".cpp", ".cc", ".cu", ".h", ".hpp", ".cuh"}

_RAW_STRING = re.compile(r'R"([^()\\ ]{0,16})\((?:.|\n)*?\)\1"')
_SCOPE = re.compile(r"(?:namespace|class|struct|union|enum|extern)\b")
_LABEL = re.compile(r"(?:(?:public|private|protected)\s*:(?!:)\s*)+")
# ``Ctor(...) : member_{value} {``: a member's brace initializer, not the body
_MEMBER_INIT = re.compile(r"\)[^;]*?(?<!:):(?!:).*[\w>]\s*$", re.S)
_NAME = re.compile(r"(operator\s*(?:\(\)|[^\s(]+)|[~\w:]+)\s*(?:=\s*\[[^\]]*\]\s*)?\(")


def _blank(text):
    """``text`` with comments, literals and preprocessor lines as spaces, newlines kept."""
    text = _RAW_STRING.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    out, i, n = [], 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            i += 1
            at_line_start = True
            continue
        if at_line_start and c == "#":  # a directive, with its continuation lines
            while i < n and not (text[i] == "\n" and text[i - 1] != "\\"):
                out.append("\n" if text[i] == "\n" else " ")
                i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif c == '"' or (c == "'" and not (i and (text[i - 1].isalnum() or text[i - 1] == "_"))):
            end = i + 1  # a ' after a digit or letter separates digits (1'000)
            while end < n and text[end] != c:
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:end]))
        i = end
    return "".join(out)


def _strip_template(header):
    """``header`` without a leading ``template <...>`` (angle brackets matched)."""
    m = re.match(r"\s*template\s*<", header)
    if not m:
        return header
    depth, i = 1, m.end()
    while i < len(header) and depth:
        depth += {"<": 1, ">": -1}.get(header[i], 0)
        i += 1
    return _strip_template(header[i:])


def _kind(header, enclosing):
    if "function" in enclosing:
        return "block"
    bare = _strip_template(_LABEL.sub("", header, count=1).lstrip())
    if _SCOPE.match(bare.lstrip()) and "(" not in bare.split("{")[0].split(":")[0]:
        return "scope"
    if "(" not in bare:
        return "block"  # an aggregate or member initializer
    if bare.count("(") > bare.count(")"):
        return "init"  # ``(uint64_t{1} << k)``: a brace inside an expression
    return "init" if _MEMBER_INIT.search(bare) else "function"


def _name(signature):
    """The name a function's signature defines (a lambda's: the variable it initializes)."""
    m = _NAME.search(signature)
    return m.group(1) if m else "<unnamed>"


def function_lengths(text):
    """[(name, first line, lines)] of the functions ``text`` (C++ source) defines."""
    code = _blank(text)
    line_starts = [m.end() for m in re.finditer("\n", code)]
    line_of = lambda pos: bisect.bisect_right(line_starts, pos) + 1  # noqa: E731
    found, stack, header_start = [], [], 0
    for m in re.finditer(r"[{};]", code):
        pos, ch = m.start(), m.group()
        if ch == ";":
            header_start = pos + 1
        elif ch == "{":
            header = code[header_start:pos]
            kind = _kind(header, [k for k, _, _ in stack])
            body = _strip_template(_LABEL.sub("", header.lstrip(), count=1)).lstrip()
            first = line_of(header_start + len(header) - len(body) if body else pos)
            stack.append((kind, _name(body), first))
            if kind != "init":
                header_start = pos + 1
        elif stack:
            kind, name, first = stack.pop()
            if kind == "function":
                found.append((name, first, line_of(pos) - first + 1))
            if kind != "init":
                header_start = pos + 1
    return found


def _sources():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in SUFFIXES)


def test_cpp_functions_fit_in_80_lines():
    assert _sources(), f"no C++ sources under {CSRC}"
    too_long = [
        f"{path.relative_to(CSRC)}:{first} {name} is {lines} lines"
        for path in _sources()
        for name, first, lines in function_lengths(path.read_text())
        if lines > MAX_LINES
    ]
    assert not too_long, f"C++ functions over {MAX_LINES} lines (split them into named helpers): {too_long}"


_SNIPPETS = {
    "free functions with a lambda and a block": (
        "namespace a {\nint f(int x) {\n  auto g = [](int y) { return y; };\n  if (x) {\n    return g(x);\n"
        "  }\n  return 0;\n}\nauto twice = [](int y) {\n  return 2 * y;\n};\n}  // namespace a\n"
        "struct Less {\n  bool operator()(int a, int b) const { return a < b; }\n};\n",
        [("f", 2, 7), ("twice", 9, 3), ("operator()", 14, 1)],
    ),
    "braces in comments, strings, characters and directives": (
        '// f() {\n/* g() { */\n#define H() {\\\n  }\nvoid k() {\n  const char* s = "{";\n  char c = \'{\';\n'
        '  auto r = R"x(})x";\n  int n = 1\'000;\n}\n',
        [("k", 5, 6)],
    ),
    "methods, a constructor's initializers and a template": (
        "template <typename T, typename U = std::vector<T>>\nclass C : public B<T> {\n public:\n"
        "  static constexpr int kMask = (int{1} << 3) - 1;\n  C(int a) : x_{a}, y_(a) {\n    x_ += 1;\n  }\n  int get() const { return x_; }\n\n"
        " private:\n  int x_{0};\n  int y_ = {1};\n};\ntemplate <typename T>\nstd::vector<T> make(\n"
        "    int n) {\n  return {};\n}\n",
        [("C", 5, 3), ("get", 8, 1), ("make", 15, 4)],
    ),
}


@pytest.mark.parametrize("snippet", _SNIPPETS)
def test_function_lengths_are_measured_from_header_to_closing_brace(snippet):
    text, expected = _SNIPPETS[snippet]
    assert function_lengths(text) == expected
