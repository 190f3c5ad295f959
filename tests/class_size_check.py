#!/usr/bin/python3
"""No class with more than 20 public methods, facades aside.

Every .h and .cc under the folders in FOLDERS is scanned, tests and test
support aside (as tests/function_length_check.py, whose scanner this
shares). A class's public methods are the distinct names of the member
functions it declares or defines under `public:` (a struct's members are
public until an access label says otherwise); constructors, destructors and
deleted functions do not count, overloads of one name count once, and
nested classes are counted apart. FACADES
are the classes allowed more: one method per operation of the API they
front.

Prints each one as file:class:line (N public methods) and exits 1; exits 0
when there is none. --self_test checks on a scratch tree that a large class
is caught and a facade, a small class and a test's class are not.
"""

import os
import re
import sys
import tempfile

import function_length_check as scan
import source_check

MAX_PUBLIC = 20
# The folders scanned; add one here to hold it to the limit too.
FOLDERS = ("base", "core", "index", "model", "client", "server")
FACADES = {
    "core/cache.h:PrefixCache",  # the cache's API, one method per operation
    "client/client.h:Client",  # the wire API, one method per RPC
}
ACCESS = ("public", "protected", "private")
IDENT = re.compile(r"[A-Za-z_]\w*$")


# Words that end a data member's type before a parenthesis, as in
# std::function<void(int)> f_.
TYPE_WORDS = {"void", "bool", "char", "int", "long", "short", "unsigned",
              "signed", "float", "double", "auto", "const", "decltype"}


def method_name(stmt, class_name):
    """The member function a class-scope statement declares or defines, or
    None (data members, types, friends, constructors, destructors)."""
    toks = [t for t, _ in stmt]
    if (not toks or "(" not in toks
            or toks[0] in ("friend", "using", "typedef", "static_assert")):
        return None
    if toks[-2:] == ["=", "delete"]:
        return None
    first = toks.index("(")
    before = toks[:first]
    if "operator" in before:
        return "operator" + "".join(toks[before.index("operator") + 1:first])
    if "=" in before or first == 0:  # a data member set from a call
        return None
    name = toks[first - 1]
    if (not IDENT.match(name) or name == class_name or name in TYPE_WORDS
            or (first >= 2 and toks[first - 2] == "~")):
        return None
    return name


def classes(text):
    """(name, line, public method names) of each class or struct."""
    found = []
    # Each open brace: [kind, name, access, methods, line].
    stack = []
    stmt = []
    for tok, line in scan.tokens(scan.strip(text)):
        top = stack[-1] if stack else None
        in_code = any(e[0] == "code" for e in stack)
        if tok == "{":
            toks = [t for t, _ in stmt]
            if in_code:
                stack.append(["code", None, None, None, line])
            elif top and top[0] in ("class_init", "ctor_init"):
                stack.append(["class_init", None, None, None, line])
            elif "namespace" in toks or toks[:1] == ["extern"]:
                stack.append(["scope", None, None, None, line])
            elif scan.classify(stmt) == "scope" and "enum" not in toks:
                name = next((t for t in toks[1:] if IDENT.match(t)
                             and not t.startswith("ABSL_")
                             and t not in ("final", "alignas")), "?")
                access = "private" if toks[0] == "class" else "public"
                stack.append(["class", name, access, set(), line])
            elif scan.classify(stmt) == "function" and scan.ctor_init_brace(
                    stmt):
                # A member's braced initializer in a constructor's list.
                stack.append(["ctor_init", None, None, None, line])
                continue
            else:
                if top and top[0] == "class" and top[2] == "public":
                    name = method_name(stmt, top[1])
                    if name:
                        top[3].add(name)
                kind = "code" if "(" in toks else "class_init"
                stack.append([kind, None, None, None, line])
            stmt = []
        elif tok == "}":
            if stack:
                kind, name, _, methods, first = stack.pop()
                if kind == "class":
                    found.append((name, first, sorted(methods)))
                if kind == "ctor_init":
                    stmt.append((tok, line))
                    continue
            if not in_code or (stack and stack[-1][0] != "code"):
                stmt = []
        elif in_code or (top and top[0] in ("class_init", "ctor_init")):
            continue
        elif tok == ";":
            if top and top[0] == "class" and top[2] == "public":
                name = method_name(stmt, top[1])
                if name:
                    top[3].add(name)
            stmt = []
        elif (tok == ":" and len(stmt) == 1 and stmt[0][0] in ACCESS
              and top and top[0] == "class"):
            top[2] = stmt[0][0]
            stmt = []
        else:
            stmt.append((tok, line))
    return found


def product_sources(root):
    saved = scan.FOLDERS
    scan.FOLDERS = FOLDERS
    try:
        yield from scan.product_sources(root)
    finally:
        scan.FOLDERS = saved


def check(root):
    problems = []
    for rel, path in product_sources(root):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name, line, methods in classes(text):
            if len(methods) > MAX_PUBLIC and f"{rel}:{name}" not in FACADES:
                problems.append(
                    f"{rel}:{name}:{line} ({len(methods)} public methods; at "
                    f"most {MAX_PUBLIC}): {', '.join(methods)}")
    return problems


def self_test():
    """A class over the limit is reported; a facade, a class at the limit,
    private methods, nested classes and tests are not."""
    def cls(name, n, extra=""):
        decls = "".join(f"  int M{i}(int x) const;\n" for i in range(n))
        return (f"class {name} {{\n public:\n  {name}();\n  ~{name}();\n"
                f"  {name}& operator=(const {name}&) = delete;\n"
                f"{decls}{extra}}};\n")
    inline = "".join(f"  void I{i}() {{ if (x_) {{ x_ = {i}; }} }}\n"
                     for i in range(21))
    files = {
        "core/big.h": "namespace prefixd {\n" + cls("Big", 21) + "}\n",
        "core/inline.h": (
            "struct Inline {\n" + inline + " private:\n  int x_ = 0;\n};\n"),
        "core/ctor.h": (
            "class Ctor {\n public:\n  Ctor() : a_{1}, b_(2) {}\n"
            "  std::function<void(int)> f_;\n  int a_, b_;\n};\n"),
        "core/cache.h": cls("PrefixCache", 30),
        "core/ok.h": cls("AtLimit", 20, (
            "  int M0(double x) const;\n  int a_ = Get(1);\n"
            "  static constexpr int kB = 3;\n"
            " private:\n" + "".join(f"  void P{i}();\n" for i in range(9))
            + "  class Nested {\n   public:\n    void N();\n  };\n")),
        "model/outer.h": ("class Outer {\n public:\n  void A();\n"
                          "  class Inner {\n   public:\n"
                          + "".join(f"    void I{i}();\n" for i in range(21))
                          + "  };\n  void B();\n};\n"),
        "core/big_test.cc": cls("InTest", 30),
        "bench/big.h": cls("NotScanned", 30),
    }
    expected = ["core/big.h:Big:2", "core/inline.h:Inline:1",
                "model/outer.h:Inner:4"]
    with tempfile.TemporaryDirectory() as root:
        source_check.write_tree(root, files)
        got = sorted(p.split(" ", 1)[0] for p in check(root))
        if got != expected:
            print(f"self test: reported {got}, expected {expected}")
            return 1
    print("self test: every large class reported, facades and small ones not")
    return 0


def passed(root):
    scanned = [d for d in FOLDERS if os.path.isdir(os.path.join(root, d))]
    return (f"class size ok (at most {MAX_PUBLIC} public methods): "
            f"{', '.join(d + '/' for d in scanned)}")


def main():
    return source_check.main(
        __doc__, check, self_test,
        f"class(es) over {MAX_PUBLIC} public methods "
        "(tests/class_size_check.py)", passed)


if __name__ == "__main__":
    sys.exit(main())
