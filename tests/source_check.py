"""What tests/layering_check.py and tests/status_idiom_check.py share: the
command line (--root, --self_test) and the self tests' scratch trees."""

import argparse
import os


def write_tree(root, files):
    """Writes {relative path: text} below `root`."""
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def main(doc, check, self_test, failure, passed):
    """Runs `check(root)` over the repository (or `self_test()`), prints each
    problem and then "<count> <failure>", or `passed(root)` when there is
    none. Returns the exit code."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="the repository (default: this one)")
    parser.add_argument("--self_test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} {failure}")
        return 1
    print(passed(args.root))
    return 0
