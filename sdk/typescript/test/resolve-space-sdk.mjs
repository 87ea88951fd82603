// node --import ./test/resolve-space-sdk.mjs FILE: run FILE with `space-sdk`
// resolving to this checkout's build (test/resolve-hooks.mjs).
import { register } from "node:module";

register("./resolve-hooks.mjs", import.meta.url);
