// Cargo's runner for wasm32-wasip1 test binaries: Node's V8 (the engine Envoy embeds) with Node's
// built-in WASI preview 1, so the core's unit tests run as the guard's own target with nothing to
// install. `cargo test --target wasm32-wasip1` calls it as `wasi-run.mjs TEST.wasm [ARGS...]`.
// A panic aborts the module (Wasm has no unwinding), so the first failing test ends the run: libtest
// must not capture its output (RUST_TEST_NOCAPTURE), or the panic message is lost with the module;
// the trap is reported and the runner exits 101, as a failing native test binary does.
import { readFile } from "node:fs/promises";
import { argv, env, exit } from "node:process";
import { WASI } from "node:wasi";

const [file, ...args] = argv.slice(2);
if (!file) {
  console.error("usage: wasi-run.mjs TEST.wasm [ARGS...]");
  exit(2);
}
const wasi = new WASI({ version: "preview1", args: [file, ...args],
  env: { ...env, RUST_TEST_NOCAPTURE: "1" }, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(file));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
let code;
try {
  code = wasi.start(instance);
} catch (e) {
  console.error(`${file}: ${e}`);
  code = 101;
}
exit(code);
