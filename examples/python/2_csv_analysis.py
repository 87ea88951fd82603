"""Upload a CSV and run an analysis on it in a sandbox."""
import pathlib

from space_sdk import Sandbox

csv = pathlib.Path(__file__).parent.parent / "data" / "weather.csv"
with Sandbox.create() as sb:
    sb.files.write("/data/weather.csv", csv.read_bytes())
    result = sb.commands.run_code("""
import csv, collections
rain = collections.Counter()
for row in csv.DictReader(open("/data/weather.csv")):
    rain[row["city"]] += int(row["rain_mm"])
city, mm = rain.most_common(1)[0]
print(f"{city} {mm}")
""", check=True)
    print("wettest:", result.stdout, end="")
    assert result.stdout == "Mumbai 841\n"
