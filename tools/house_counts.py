#!/usr/bin/env python3
"""Prints the figures a maintainer keeps an eye on to keep the code easy to read (docs/layout.md):

  - how many of the repository's headers a user's `#include "ddp.h"` reads (the public header stays narrow);
  - the launcher's largest files, in lines;
  - functions of 60 lines or more outside CUDA kernels (.cu files), with their length;
  - lines of runtime/, launcher/ and capi/ that say "main job" (a benchmark's name, which belongs in bench/).

  python3 tools/house_counts.py

The function scan matches braces in .cc and .h files with comments and literals blanked out: a function is a
brace block at namespace or class scope whose head ends like a signature (`...) {`, `...) const {`, a
constructor's initializer list). Good enough to find long functions; not a C++ parser.
"""
import os
import re
import subprocess
import sys
import tempfile

LONG_FUNCTION_LINES = 60
LAUNCHER_FILES_SHOWN = 8
PLAIN_WORDS_FOLDERS = ("runtime/", "launcher/", "capi/")


def repo_root():
    return subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()


def tracked(root, *patterns):
    return subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns], cwd=root,
                          capture_output=True, text=True, check=True).stdout.split()


def headers_reached_by_ddp_h(root):
    """The repository's headers (ddp.h aside) a translation unit that includes ddp.h reads, as the compiler lists
    them."""
    cxx = os.environ.get("CXX", "c++")
    with tempfile.TemporaryDirectory() as tmp:
        tu = os.path.join(tmp, "uses_ddp.cc")
        with open(tu, "w") as f:
            f.write('#include "ddp.h"\n')
        deps = subprocess.run([cxx, "-std=c++20", "-M", "-I", root, tu], capture_output=True, text=True,
                              check=True).stdout
    files = {os.path.normpath(w) for w in deps.replace("\\\n", " ").split() if not w.endswith(":")}
    return sorted(os.path.relpath(f, root) for f in files
                  if f.startswith(root + os.sep) and os.path.relpath(f, root) != "ddp.h")


def blank_comments_and_literals(text):
    """The text with comments, string and character literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            j = text.find(")" + delim + '"', open_paren)
            j = n if j < 0 else j + len(delim) + 2
            out.append('""' + "".join(ch if ch == "\n" else " " for ch in text[i + 2:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


CONTROL = re.compile(r"^(if|for|while|switch|catch|do|else|return|case)\b")
SIGNATURE_TAIL = re.compile(r"\)\s*(const|override|final|noexcept|mutable|&|&&|\s|->\s*[\w:<>,\s\*&]+)*$")
INITIALIZER_LIST = re.compile(r"\)\s*(noexcept\s*)?:\s*[\w:]+\s*[({]")


def function_head(segment):
    """Whether the code before a '{' (back to the previous ';', '{' or '}') is a function's signature."""
    head = " ".join(segment.split())
    head = re.sub(r"^(public|private|protected)\s*:\s*", "", head)
    head = re.sub(r"^#.*", "", head).strip()
    if "(" not in head or CONTROL.match(head) or head.startswith(("namespace", "extern")):
        return False
    if SIGNATURE_TAIL.search(head):
        return True
    return bool(INITIALIZER_LIST.search(head))


def long_functions(root, path, min_lines):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        text = blank_comments_and_literals(f.read())
    # Preprocessor lines hold no braces a function's body depends on.
    text = "\n".join("" if line.lstrip().startswith("#") else line for line in text.split("\n"))
    found = []
    stack = []  # per open brace: (is a function body, its start offset)
    segment_start = 0
    inside_function = 0
    for i, c in enumerate(text):
        if c == "{":
            is_function = inside_function == 0 and function_head(text[segment_start:i])
            start = segment_start if is_function else i
            stack.append((is_function, start))
            if is_function or inside_function:
                inside_function += 1
            segment_start = i + 1
        elif c == "}":
            if stack:
                is_function, start = stack.pop()
                if inside_function:
                    inside_function -= 1
                if is_function:
                    head_text = text[start:i]
                    first = start + len(head_text) - len(head_text.lstrip())
                    first_line = text.count("\n", 0, first) + 1
                    last_line = text.count("\n", 0, i) + 1
                    if last_line - first_line + 1 >= min_lines:
                        name = re.search(r"([~\w:]+(?:operator\S*)?)\s*\(", " ".join(text[first:i].split()))
                        found.append((last_line - first_line + 1, f"{path}:{first_line}",
                                      name.group(1) if name else "?"))
            segment_start = i + 1
        elif c == ";" and not inside_function:
            segment_start = i + 1
    return found


def main():
    root = repo_root()
    reached = headers_reached_by_ddp_h(root)
    print(f"ddp.h reaches {len(reached)} repository headers")

    launcher = [(sum(1 for _ in open(os.path.join(root, p), encoding="utf-8")), p)
                for p in tracked(root, "launcher/*.cc", "launcher/*.h")]
    launcher.sort(reverse=True)
    print(f"largest launcher files ({len(launcher)} files):")
    for lines, path in launcher[:LAUNCHER_FILES_SHOWN]:
        print(f"  {lines:5d}  {path}")

    functions = []
    for path in tracked(root, "*.cc", "*.h"):
        if path.startswith("third_party/"):
            continue
        functions += long_functions(root, path, LONG_FUNCTION_LINES)
    functions.sort(reverse=True)
    print(f"functions of {LONG_FUNCTION_LINES}+ lines outside .cu files: {len(functions)}"
          f" ({sum(1 for f in functions if f[0] >= 80)} of 80+)")
    for lines, where, name in functions:
        print(f"  {lines:5d}  {where}  {name}")

    plain = []
    for path in tracked(root, *(folder + "*" for folder in PLAIN_WORDS_FOLDERS)):
        try:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                plain += [f"{path}:{n}" for n, line in enumerate(f, 1) if "main job" in line.lower()]
        except (UnicodeDecodeError, IsADirectoryError):
            continue
    print(f'lines saying "main job" in {", ".join(PLAIN_WORDS_FOLDERS)}: {len(plain)}')
    for where in plain:
        print(f"  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
