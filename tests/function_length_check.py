#!/usr/bin/python3
"""No product function over 60 lines, tables aside.

Every .h and .cc under the folders in FOLDERS is scanned, tests and test
support aside (TEST_SUPPORT). A function's length is its lines from the first
line of its signature through its closing brace, less the lines of the
tables in it: a braced initializer after `=`, `return`, `(` or `,` (a flag
list, a static table, a returned aggregate) counts as its first line only.
Lambdas and local classes count towards the function that holds them. A
table outside any function (`const Foo kFoos[] = {...};`) is no function.

The scan strips comments, string and character literals (raw strings too)
and preprocessor lines, then follows the braces: a `{` at namespace or class
scope opens a function when what precedes it has a parameter list and no
`=` before it; `class`, `struct`, `union`, `enum` and `namespace` open
scopes.

Prints each one as file:function:first-last (N lines) and exits 1; exits 0
when there is none. --self_test checks on a scratch tree that long functions
are caught and tables and short ones are not.
"""

import os
import re
import sys
import tempfile

import source_check

MAX_LINES = 60
# The folders scanned; add one here to hold it to the limit too.
FOLDERS = ("base", "core", "index", "model", "client", "server")
# Files of those folders that are tests or test support, not product.
TEST_SUPPORT = {
    "core/differential_driver.cc", "core/differential_driver.h",
    "core/reference_model.cc", "core/reference_model.h",
    "server/test_server.cc", "server/test_server.h",
    "index/stored_for_test.h",
}
TEST_SUFFIXES = ("_test.cc", "_fuzzer.cc")

TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.']*|::|->|[=!<>]=|.", re.S)
SCOPE_KEYWORDS = ("class", "struct", "union", "enum")
INIT_BEFORE = ("=", "return", "(", ",")


def strip(text):
    """Text with comments, literals and preprocessor lines blanked (newlines
    kept, so that line numbers stay)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        if c == "\n":
            out.append(c)
            line_start = True
            i += 1
            continue
        if c in " \t":
            out.append(c)
            i += 1
            continue
        line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end) or " ")
            i = end
        elif (c == "R" and text.startswith('"', i + 1)
              and not (i and (text[i - 1].isalnum() or text[i - 1] == "_"))):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            end = text.find(")" + delim + '"', open_paren)
            end = n if end < 0 else end + len(delim) + 2
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c in "\"'":
            if c == "'" and i and text[i - 1].isalnum():  # 1'000'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def tokens(text):
    """(token, line) pairs of stripped text."""
    line = 1
    for m in TOKEN.finditer(text):
        tok = m.group(0)
        if tok == "\n":
            line += 1
        elif not tok.isspace():
            yield tok, line


def depth0(stmt):
    """The tokens of stmt outside parentheses, brackets and templates'
    parameter lists are hard to tell from less-than; parentheses suffice."""
    depth = 0
    for tok, line in stmt:
        if tok in "([":
            depth += 1
        elif tok in ")]":
            depth -= 1
        elif depth == 0:
            yield tok, line


def classify(stmt):
    """What a `{` at namespace or class scope opens, given the tokens since
    the previous `;`, `{` or `}`: "scope", "function" or "init"."""
    toks = [t for t, _ in stmt]
    if "namespace" in toks or (toks and toks[0] == "extern"):
        return "scope"
    body = toks
    if body[:1] == ["template"]:  # skip template <...>
        depth = 0
        for k, t in enumerate(body):
            depth += t == "<"
            depth -= t == ">"
            if k and depth == 0:
                body = body[k + 1:]
                break
    if body[:1] and body[0] in SCOPE_KEYWORDS:
        return "scope"
    outer = [t for t, _ in depth0(stmt)]
    for k, t in enumerate(outer):
        if t == "=" and (k == 0 or outer[k - 1] != "operator"):
            return "init"
    return "function" if "(" in toks else "init"


def function_name(stmt):
    toks = [t for t, _ in stmt]
    first = toks.index("(")
    k = first - 1
    if "operator" in toks[:first]:
        op = toks.index("operator")
        return "".join(toks[op - 2 if op >= 2 and toks[op - 1] == "::"
                            else op:first])
    name = toks[k]
    while k >= 2 and toks[k - 1] == "::":
        name = toks[k - 2] + "::" + name
        k -= 2
    if k >= 1 and toks[k - 1] == "~":
        name = "~" + name
    return name


def ctor_init_brace(stmt):
    """Whether a `{` after stmt opens a member's braced initializer in a
    constructor's initializer list (`: a_{1}, b_(2) {`), not the body."""
    outer = [t for t, _ in depth0(stmt)]
    last = stmt[-1][0]
    return (re.match(r"[A-Za-z_]\w*$", last) is not None and ":" in outer
            and "->" not in outer)


def functions(text):
    """(name, first line, last line, table lines) of each function."""
    found = []
    # Each open brace: [kind, first line, table lines, name]. Kinds: scope
    # (namespace, class), function, block and table (in a function), init
    # (an initializer outside any function), ctor_init (see above).
    stack = []
    stmt = []
    prev = None
    for tok, line in tokens(strip(text)):
        kinds = [entry[0] for entry in stack]
        in_function = "function" in kinds
        in_init = "init" in kinds or "ctor_init" in kinds
        if tok == "{":
            if in_function:
                table = prev in INIT_BEFORE and "table" not in kinds
                stack.append(["table" if table else "block", line, 0, None])
            elif in_init:
                stack.append(["init", line, 0, None])
            else:
                kind = classify(stmt) if stmt else "init"
                if kind == "function" and ctor_init_brace(stmt):
                    kind = "ctor_init"
                if kind == "function":
                    stack.append([kind, stmt[0][1], 0, function_name(stmt)])
                else:
                    stack.append([kind, line, 0, None])
                if kind != "ctor_init":
                    stmt = []
        elif tok == "}":
            if stack:
                kind, first, tables, name = stack.pop()
                if kind == "table":
                    next(e for e in reversed(stack)
                         if e[0] == "function")[2] += line - first
                elif kind == "function":
                    found.append((name, first, line, tables))
                if kind == "ctor_init":
                    stmt.append((tok, line))
                elif not in_function or kind == "function":
                    stmt = []
        elif in_function or in_init:
            pass
        elif tok == ";":
            stmt = []
        elif tok == ":" and [t for t, _ in stmt] in (
                ["public"], ["protected"], ["private"]):
            stmt = []
        else:
            stmt.append((tok, line))
        prev = tok
    return found


def product_sources(root):
    for folder in FOLDERS:
        top = os.path.join(root, folder)
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, names in os.walk(top):
            dirnames.sort()
            for name in sorted(names):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if (name.endswith((".h", ".cc"))
                        and not name.endswith(TEST_SUFFIXES)
                        and rel not in TEST_SUPPORT):
                    yield rel, path


def check(root):
    problems = []
    for rel, path in product_sources(root):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name, first, last, tables in functions(text):
            length = last - first + 1 - tables
            if length > MAX_LINES:
                problems.append(
                    f"{rel}:{name}:{first}-{last} ({length} lines; at most "
                    f"{MAX_LINES}, tables aside)")
    return problems


def self_test():
    """Long functions in a scratch tree are each reported; tables, tests
    and short functions are not."""
    body = "".join(f"  x += {i};\n" for i in range(60))
    table = "".join(f"    {{{i}, \"}}\"}},\n" for i in range(80))
    files = {
        "core/long.cc": (
            "namespace prefixd {\nnamespace {\n"
            "int Short(int x) {\n  return x;\n}\n"
            "}  // namespace\n"
            f"int Long(int x) {{\n{body}  return x;\n}}\n"
            f"int Tenant::Method(int x) const {{\n{body}  return x;\n}}\n"
            "}  // namespace prefixd\n"),
        "core/table.cc": (
            f"const Entry kTable[] = {{\n{table}}};\n"
            f"std::vector<Entry> Flags() {{\n  return {{\n{table}  }};\n}}\n"
            "int Edge(int x) {\n" + "  x += 1;\n" * 57 + "  return x;\n}\n"),
        "model/inline.h": (
            "class Foo {\n public:\n  Foo() : a_{1}, b_(2) {\n"
            f"{body}  }}\n  int a_, b_;\n}};\n"
            "/* int Commented() {\n" + "\n" * 70 + "} */\n"
            'const char* kPage = R"(\nfunction f() {\n' + "\n" * 70
            + '}\n)";\n'),
        "client/lambda.cc": (
            "void Run() {\n  auto f = [&](int x) -> bool {\n"
            f"{body}    return true;\n  }};\n}}\n"),
        "core/long_test.cc": f"TEST(A, B) {{\n{body}}}\n",
        "core/reference_model.cc": f"void Model() {{\n{body}}}\n",
        "bench/long.cc": f"void NotScanned() {{\n{body}}}\n",
    }
    expected = [
        "client/lambda.cc:Run:1-65", "core/long.cc:Long:7-69",
        "core/long.cc:Tenant::Method:70-132", "model/inline.h:Foo:3-64",
    ]
    with tempfile.TemporaryDirectory() as root:
        source_check.write_tree(root, files)
        got = sorted(p.split(" ", 1)[0] for p in check(root))
        if got != expected:
            print(f"self test: reported {got}, expected {expected}")
            return 1
    print("self test: every long function reported, tables and tests not")
    return 0


def passed(root):
    scanned = [d for d in FOLDERS if os.path.isdir(os.path.join(root, d))]
    return (f"function length ok (at most {MAX_LINES} lines): "
            f"{', '.join(d + '/' for d in scanned)}")


def main():
    return source_check.main(
        __doc__, check, self_test,
        f"function(s) over {MAX_LINES} lines (tests/function_length_check.py)",
        passed)


if __name__ == "__main__":
    sys.exit(main())
