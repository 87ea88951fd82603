// Upload a CSV and run an analysis on it in a sandbox.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { Sandbox } from "space-sdk";

const csv = await readFile(new URL("../data/weather.csv", import.meta.url));
const sb = await Sandbox.create();
try {
  await sb.files.write("/data/weather.csv", csv);
  const result = await sb.commands.runCode(`
import csv, collections
rain = collections.Counter()
for row in csv.DictReader(open("/data/weather.csv")):
    rain[row["city"]] += int(row["rain_mm"])
city, mm = rain.most_common(1)[0]
print(f"{city} {mm}")
`, { check: true });
  console.log("wettest:", result.stdout.trim());
  assert.equal(result.stdout, "Mumbai 841\n");
} finally {
  await sb.kill();
}
