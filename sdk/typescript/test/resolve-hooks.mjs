// Module resolution hooks for the docs and examples tests: `space-sdk`
// resolves to this checkout's build wherever the importing file is.
const dist = new URL("../dist/index.js", import.meta.url).href;

export async function resolve(specifier, context, next) {
  return specifier === "space-sdk" ? next(dist, context) : next(specifier, context);
}
