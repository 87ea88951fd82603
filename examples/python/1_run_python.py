"""Run Python in a sandbox and read the result."""
from space_sdk import Sandbox

with Sandbox.create() as sb:
    result = sb.commands.run_code("import math; print(math.factorial(20))")
    print(result.stdout, end="")
    assert result.exit_code == 0 and result.stdout == "2432902008176640000\n"
