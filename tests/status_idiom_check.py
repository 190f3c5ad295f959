#!/usr/bin/python3
"""server/ propagates errors with one idiom (server/grpc_status.h).

A function of server/ that only passes an error on writes RETURN_IF_ERROR or
ASSIGN_OR_RETURN (base/status_macros.h). Every .cc and .h under server/
(tests aside) is scanned for the hand-written forms that do nothing else:

    if (!x.ok()) return x.status();          (or x->ok(), x->status())
    if (!s.ok()) return s;
    if (absl::Status s = f(); !s.ok()) return s;

with or without braces, over several lines, after `else` too. A check that
adds context to the message, handles one code or logs and carries on
returns something else and is not reported.

Prints each one as file:line and exits 1; exits 0 when there is none.
--self_test checks on a scratch tree that each form is caught.
"""

import os
import re
import sys
import tempfile

import source_check

EXEMPT = set()

# A statement of up to this many lines is joined before matching.
WINDOW = 5

PLAIN = [
    re.compile(r"^(?:\} )?(?:else )?if \(!(\w+)(\.|->)ok\(\)\) \{? ?"
               r"return \1\2status\(\); ?\}?$"),
    re.compile(r"^(?:\} )?(?:else )?if \(!(\w+)\.ok\(\)\) \{? ?"
               r"return \1; ?\}?$"),
    re.compile(r"^(?:\} )?(?:else )?if \(absl::Status (\w+) = [^;]*; "
               r"!\1\.ok\(\)\) \{? ?return \1; ?\}?$"),
]


def sources(root):
    top = os.path.join(root, "server")
    if not os.path.isdir(top):
        return
    for dirpath, _, names in os.walk(top):
        for name in sorted(names):
            if not name.endswith((".cc", ".h")) or name.endswith("_test.cc"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel not in EXEMPT:
                yield rel, path


def statement(lines, i):
    """Lines i.. joined (one space between tokens) up to the end of the
    if's body: its first `;` outside the condition, or its closing brace."""
    text = ""
    for line in lines[i:i + WINDOW]:
        text = " ".join((text + " " + line.strip()).split())
        if text.endswith("}") or (text.endswith(";") and
                                  text.count("(") == text.count(")") and
                                  not text.endswith("{")):
            break
    return text


def check_file(rel, path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    problems = []
    for i, line in enumerate(lines):
        if not re.match(r"^\s*(\} )?(else )?if \(", line):
            continue
        text = statement(lines, i)
        if any(p.match(text) for p in PLAIN):
            problems.append(f"{rel}:{i + 1}: {text}: write RETURN_IF_ERROR "
                            "or ASSIGN_OR_RETURN (base/status_macros.h)")
    return problems


def check(root):
    problems = []
    for rel, path in sources(root):
        problems += check_file(rel, path)
    return problems


def self_test():
    """Each plain form in a scratch tree is reported; the rest are not."""
    files = {
        "server/a.cc": (
            "absl::Status F() {\n"
            "  absl::StatusOr<int> x = G();\n"
            "  if (!x.ok()) return x.status();\n"           # 3
            "  if (!x->ok()) return x->status();\n"         # 4
            "  absl::Status s = H();\n"
            "  if (!s.ok()) {\n"                            # 6
            "    return s;\n"
            "  }\n"
            "  if (absl::Status t = H(); !t.ok()) return t;\n"  # 9
            "  if (absl::Status t =\n"                      # 10
            "          H(1, 2);\n"
            "      !t.ok()) {\n"
            "    return t;\n"
            "  }\n"
            "  } else if (absl::Status t = H(); !t.ok()) {\n"  # 15
            "    return t;\n"
            "  }\n"
            "  return x;\n"
            "}\n"),
        "server/ok.cc": (
            "absl::Status F() {\n"
            "  if (!v.ok()) return InField(\"f\", v.status());\n"
            "  if (!b.ok()) break;\n"
            "  if (!s.ok()) {\n"
            "    LOG(s);\n"
            "    return s;\n"
            "  }\n"
            "  if (!n.ok() && n.status().code() != kNotFound) {\n"
            "    return n.status();\n"
            "  }\n"
            "  if (!call.ok()) return new FailedStream(call.status());\n"
            "}\n"),
        "server/a_test.cc": "  if (!x.ok()) return x.status();\n",
    }
    expected = ["server/a.cc:10:", "server/a.cc:15:", "server/a.cc:3:",
                "server/a.cc:4:", "server/a.cc:6:", "server/a.cc:9:"]
    with tempfile.TemporaryDirectory() as root:
        source_check.write_tree(root, files)
        got = sorted(p.split(" ", 1)[0] for p in check(root))
        if got != expected:
            print(f"self test: reported {got}, expected {expected}")
            return 1
    print("self test: every plain form reported, the others pass")
    return 0


def main():
    return source_check.main(
        __doc__, check, self_test,
        "hand-written error check(s) that only pass the error on "
        "(server/grpc_status.h, tests/status_idiom_check.py)",
        lambda root: "status idiom ok: server/")


if __name__ == "__main__":
    sys.exit(main())
