"""Summarize a py-spy collapsed-stack profile (``py-spy record --format raw``) as text.

Not a test. Prints samples per thread, then the frames with the most samples including
their callees (inclusive) and on their own (self), optionally for one thread only.

    .venv/bin/python benchmarks/profile_summary.py benchmarks/profiles/dgram.txt --thread MainThread
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--thread", help="only stacks of threads whose name contains this")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in args.profile.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0].split(":", 1)[-1].strip()  # "thread (1234): MainThread"
        count = int(count_text)
        threads[thread] += count
        if args.thread and args.thread not in thread:
            continue
        total += count
        for frame in set(frames[1:]):
            inclusive[frame] += count
        own[frames[-1]] += count
    print("samples per thread:")
    for thread, count in threads.most_common():
        print(f"  {count:>7}  {thread}")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"\n{title} ({total} samples{', ' + args.thread if args.thread else ''}):")
        for frame, count in counter.most_common(args.top):
            print(f"  {100 * count / max(total, 1):5.1f}%  {frame}")


if __name__ == "__main__":
    main()
