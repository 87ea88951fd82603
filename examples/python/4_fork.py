"""Prepare a sandbox once, fork it, and try two approaches side by side."""
from space_sdk import Sandbox

with Sandbox.create() as sb:
    sb.files.write("/work/numbers.txt", "\n".join(str(n) for n in range(100000, 0, -1)))
    a, b = sb.fork(2)  # two running copies, files and processes included
    with a, b:
        py = a.commands.run_code("print(sum(sorted(int(l) for l in open('/work/numbers.txt'))[:10]))")
        sh = b.commands.run("sort -n /work/numbers.txt | head -10 | awk '{s += $1} END {print s}'")
        print("python:", py.stdout.strip(), " shell:", sh.stdout.strip())
        assert py.stdout.strip() == sh.stdout.strip() == "55"
