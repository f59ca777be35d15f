// The floor under the measured host's barrier (bench/control.ts): a bare Unix-socket server that
// answers every line of the local channel (sdk/contract/protocol/channel.ts) as the launcher answers an
// `attach` and a `continue` barrier. It reads lines as the launcher's ChannelServer does, but
// checks no schema and asks no HostAgent: what any local channel costs on this machine (the
// client's write, a sleeping process woken, a line read and written back).
//
//   node bin/run-ts.js bench/channel-echo.ts PATH    prints `listening on PATH`; SIGTERM ends it
import { rmSync } from "node:fs";
import { createServer } from "node:net";
import { createInterface } from "node:readline";
import { CHANNEL_VERSION } from "../sdk/contract/protocol/channel.ts";

const path = process.argv[2];
if (!path) {
  process.stderr.write("usage: channel-echo.ts PATH\n");
  process.exit(2);
}
const attached = `${JSON.stringify({ v: CHANNEL_VERSION, type: "attached", rank: 0, worldSize: 1, masterAddr: "127.0.0.1", masterPort: 29500, generation: 0, localRank: 0, resume: null, control: null })}\n`;
const directive = `${JSON.stringify({ v: CHANNEL_VERSION, type: "directive", directive: { kind: "continue" } })}\n`;
const server = createServer((socket) => {
  socket.on("error", () => {});
  const lines = createInterface({ input: socket, crlfDelay: Infinity });
  lines.on("error", () => {});
  lines.on("line", (line) => socket.write(line.includes('"type":"attach"') ? attached : directive));
});
rmSync(path, { force: true });
server.listen(path, () => process.stdout.write(`listening on ${path}\n`));
process.once("SIGTERM", () => {
  server.close();
  rmSync(path, { force: true });
  process.exit(0);
});
