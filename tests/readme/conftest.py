"""Prints what tests/readme/test_readme.py did with each README block, and the count of each
language's blocks by outcome, at the end of every run (passing or not)."""
import collections


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    summary = getattr(config, "_readme_summary", None)
    if summary is None:
        return
    blocks, outcomes = summary
    write = terminalreporter.write_line
    write("README.md code blocks:")
    counts = collections.Counter()
    for b in blocks:
        o = outcomes.get(b.id)
        status = o.status if o else "not checked"
        counts[(b.lang, status.split(" ")[0])] += 1
        detail = ""
        if o and o.status == "skipped":
            detail = f": {o.detail}"
        elif o and o.status == "checked" and o.detail:
            detail = f": {o.detail}"
        write(f"  README.md:{b.line:<4} {b.lang:<7} {status}{detail}  [{b.section}]")
    by_lang = collections.defaultdict(list)
    for (lang, status), n in sorted(counts.items()):
        by_lang[lang].append(f"{n} {status}")
    write("  " + "; ".join(f"{lang}: {', '.join(v)}" for lang, v in by_lang.items()))
