// Data-plane benchmark: staging-to-staging transfers between two processes, beside a plain-socket
// baseline (bench/baseline_socket.py: one stream, no framing, no checksums) moving the same bytes
// between the same buffers in the same run; then checkpoint packing against memcpy.
//
// Paths: loopback, and two network namespaces joined by a veth pair (needs root and iproute2;
// only addresses created inside those namespaces are used). Each method runs --rounds times,
// alternating, and the median is reported; every transfer is verified by CRC32C afterwards.
//
//   npm run bench:transfer -- --size 1GiB --rounds 3
import { spawnSync } from "node:child_process";
import { z } from "zod";
import { bool, checked, helpText, num, parseCommandFlags, size } from "../cli/flags.ts";
import { byteSize, table } from "../cli/io.ts";
import { benchMain } from "./entry.ts";
import { baselineRun, LOOPBACK, Peer, secondsSchema, type Namespaces } from "./socket-baseline.ts";
import { StagingBuffer, copyWithCrc32c, removeStaleStagingBuffers, transferTicketSchema, type TransferTicket } from "../native/index.ts";
import { checkpointCapacity, packCheckpoint, type CheckpointItemInput } from "../sdk/contract/checkpoint/index.ts";

const GiB = 2 ** 30;
const MiB = 2 ** 20;
const here = (file: string): string => new URL(file, import.meta.url).pathname;
const RUN_TS = here("../bin/run-ts.js");
const PEER = here("./transfer-peer.ts");

const FLAGS = {
  size: size("BYTES", "transfer size, e.g. 4GiB, 512MiB, 1000000", { default: 4 * GiB, show: "4GiB" }),
  "pack-size": checked("BYTES", "bytes packed into the checkpoint (default: min(size, 1GiB))", (raw, name) => byteSize(name, raw)),
  streams: num("N", "parallel TCP streams of the engine", { default: 4, min: 1 }),
  chunk: size("BYTES", "engine chunk size", { default: 8 * MiB, show: "8MiB" }),
  rounds: num("N", "runs per method and path; the median is reported", { default: 3, min: 1 }),
  "no-netns": bool("skip the veth/network-namespace path"),
  json: bool("one JSON line instead of tables"),
};

const help = helpText({
  command: "npm run bench:transfer --",
  table: FLAGS,
  about: `Moves --size bytes between two staging buffers in two processes, with MonkeyTree's TCP engine
and with a plain-socket baseline, over loopback and over a veth pair between two network
namespaces; then packs a checkpoint into staging and compares it with memcpy.`,
});

function options(argv: string[]) {
  const flags = parseCommandFlags(argv, FLAGS);
  return {
    size: flags.size,
    packSize: flags["pack-size"] ?? Math.min(flags.size, GiB),
    streams: flags.streams,
    chunk: flags.chunk,
    rounds: Math.round(flags.rounds),
    netns: !flags["no-netns"],
    json: flags.json,
  };
}
type Options = ReturnType<typeof options>;

/** Creates two namespaces joined by a veth pair; returns undefined with the reason when it cannot. */
function createVethPair(): { namespaces: Namespaces; remove(): void } | string {
  if (process.getuid?.() !== 0) return "needs root";
  if (spawnSync("ip", ["-V"]).status !== 0) return "iproute2 (`ip`) is not installed";
  const tag = `mtb${process.pid % 100000}`;
  const [a, b] = [`${tag}a`, `${tag}b`];
  const remove = (): void => {
    spawnSync("ip", ["netns", "del", a]);
    spawnSync("ip", ["netns", "del", b]);
  };
  const steps = [
    ["netns", "add", a],
    ["netns", "add", b],
    ["link", "add", `${tag}x`, "netns", a, "type", "veth", "peer", "name", `${tag}y`, "netns", b],
    ["-n", a, "addr", "add", "10.231.0.1/30", "dev", `${tag}x`],
    ["-n", b, "addr", "add", "10.231.0.2/30", "dev", `${tag}y`],
    ["-n", a, "link", "set", `${tag}x`, "up"],
    ["-n", b, "link", "set", `${tag}y`, "up"],
    ["-n", a, "link", "set", "lo", "up"],
    ["-n", b, "link", "set", "lo", "up"],
  ];
  for (const step of steps) {
    const run = spawnSync("ip", step, { encoding: "utf8" });
    if (run.status !== 0) {
      remove();
      return `\`ip ${step.join(" ")}\` failed: ${run.stderr.trim()}`;
    }
  }
  return {
    namespaces: {
      name: "veth netns",
      sender: ["ip", "netns", "exec", a],
      receiver: ["ip", "netns", "exec", b],
      receiverHost: "10.231.0.2",
    },
    remove,
  };
}

async function engineRun(ns: Namespaces, source: StagingBuffer, destination: StagingBuffer, opts: Options): Promise<number> {
  const node = [process.execPath, RUN_TS, PEER];
  const receiver = new Peer([...ns.receiver, ...node, "receive", "--buffer", destination.name, "--host", ns.receiverHost, "--length", String(opts.size)]);
  try {
    const { ticket } = await receiver.next(z.object({ ticket: transferTicketSchema }));
    const sender = new Peer([
      ...ns.sender,
      ...node,
      "send",
      "--buffer",
      source.name,
      "--ticket",
      JSON.stringify(ticket satisfies TransferTicket),
      "--streams",
      String(opts.streams),
      "--chunk",
      String(opts.chunk),
    ]);
    try {
      const { sent } = await sender.next(z.object({ sent: secondsSchema }));
      await receiver.next(z.object({ received: z.object({ bytes: z.literal(opts.size) }) }));
      return sent.seconds;
    } finally {
      sender.kill();
    }
  } finally {
    receiver.kill();
  }
}

function median(values: number[]): number {
  const sorted = [...values].sort((x, y) => x - y);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? (sorted[mid] ?? NaN) : ((sorted[mid - 1] ?? NaN) + (sorted[mid] ?? NaN)) / 2;
}

type Method = "plain socket" | "monkeytree tcp, 1 stream" | "monkeytree tcp";

interface TransferRow {
  path: string;
  method: string;
  bytes: number;
  seconds: number;
  gbps: number;
  ratio: number;
}

/** Flips one byte per MiB, so verification fails unless a run rewrote every MiB. */
function spoil(buffer: StagingBuffer, size: number): void {
  const bytes = buffer.bytes(0, size);
  for (let offset = 0; offset < size; offset += MiB) bytes[offset] = (bytes[offset] ?? 0) ^ 0xff;
}

async function measurePath(ns: Namespaces, source: StagingBuffer, destination: StagingBuffer, opts: Options): Promise<TransferRow[]> {
  const expected = source.crc32c(0, opts.size);
  // The single-stream engine run is the like-for-like comparison with the one-stream baseline.
  const methods: [Method, () => Promise<number>][] = [
    ["plain socket", () => baselineRun(ns, source, destination, opts.size)],
    ["monkeytree tcp, 1 stream", () => engineRun(ns, source, destination, { ...opts, streams: 1 })],
    ["monkeytree tcp", () => engineRun(ns, source, destination, opts)],
  ];
  const times = new Map<Method, number[]>(methods.map(([method]) => [method, []]));
  for (let round = 0; round < opts.rounds; round++) {
    for (const [method, run] of methods) {
      spoil(destination, opts.size);
      const seconds = await run();
      if (destination.crc32c(0, opts.size) !== expected) throw new Error(`${ns.name} ${method}: destination bytes differ from the source`);
      times.get(method)?.push(seconds);
    }
  }
  const baseline = median(times.get("plain socket") ?? []);
  return methods.map(([method]) => {
    const seconds = median(times.get(method) ?? []);
    const name = method === "monkeytree tcp" ? `monkeytree tcp, ${opts.streams} streams` : method;
    return { path: ns.name, method: name, bytes: opts.size, seconds, gbps: (opts.size * 8) / seconds / 1e9, ratio: baseline / seconds };
  });
}

interface PackingResult {
  bytes: number;
  tensors: number;
  memcpyGBps: number;
  packGBps: number;
  copyCrcGBps: number;
  ratio: number;
}

/** memcpy (TypedArray.set) of the same tensors into the same staging bytes, against packCheckpoint. */
function measurePacking(opts: Options): PackingResult {
  const tensors = 256;
  const each = Math.max(8, Math.floor(opts.packSize / tensors / 8) * 8);
  const items: CheckpointItemInput[] = Array.from({ length: tensors }, (_, i) => {
    const data = new Uint8Array(each);
    for (let j = 0; j < each; j += 4096) data[j] = (i + j) & 0xff;
    return { fqn: `model.layers.${i}.weight`, kind: "tensor", dtype: "bfloat16", chunks: [{ sizes: [each / 2], data }] };
  });
  const staging = StagingBuffer.create({ size: checkpointCapacity(items), lock: false });
  try {
    const target = staging.bytes();
    const layout = packCheckpoint(target, items).metadata.items.map((item) => (item.kind === "tensor" ? (item.chunks[0]?.storageOffset ?? 0) : 0));
    const bytes = each * tensors;
    const timed = (fn: () => void): number => {
      const started = performance.now();
      fn();
      return bytes / ((performance.now() - started) / 1000) / 1e9;
    };
    const runs = { memcpy: [] as number[], pack: [] as number[], copyCrc: [] as number[] };
    for (let round = 0; round < Math.max(3, opts.rounds); round++) {
      runs.memcpy.push(timed(() => items.forEach((item, i) => item.kind === "tensor" && target.set(item.chunks[0]!.data, layout[i]))));
      runs.copyCrc.push(timed(() => items.forEach((item, i) => item.kind === "tensor" && copyWithCrc32c(target.subarray(layout[i]), item.chunks[0]!.data))));
      runs.pack.push(timed(() => packCheckpoint(target, items)));
    }
    const memcpyGBps = median(runs.memcpy);
    const packGBps = median(runs.pack);
    return { bytes, tensors, memcpyGBps, packGBps, copyCrcGBps: median(runs.copyCrc), ratio: packGBps / memcpyGBps };
  } finally {
    staging.free();
  }
}

function fillSource(source: StagingBuffer, size: number): void {
  const bytes = source.bytes(0, size);
  const pattern = new Uint8Array(MiB);
  let state = 0x2545f491;
  for (let i = 0; i < pattern.length; i++) {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    pattern[i] = state & 0xff;
  }
  for (let offset = 0; offset < size; offset += MiB) {
    const n = Math.min(MiB, size - offset);
    bytes.set(pattern.subarray(0, n), offset);
    bytes[offset] = (offset / MiB) & 0xff; // every MiB differs, so a misplaced chunk is caught
  }
}

async function main(opts: Options): Promise<number> {
  if (spawnSync("python3", ["--version"]).status !== 0) {
    process.stderr.write("bench:transfer: the plain-socket baseline needs python3 on PATH\n");
    return 3;
  }
  const notes: string[] = [];
  const stale = removeStaleStagingBuffers();
  if (stale.length > 0) notes.push(`removed ${stale.length} staging buffers left in /dev/shm by dead processes`);
  const rows: TransferRow[] = [];
  const source = StagingBuffer.create({ size: opts.size, lock: false });
  const destination = StagingBuffer.create({ size: opts.size, lock: false });
  try {
    fillSource(source, opts.size);
    rows.push(...(await measurePath(LOOPBACK, source, destination, opts)));
    if (opts.netns) {
      const veth = createVethPair();
      if (typeof veth === "string") {
        notes.push(`veth netns path skipped: ${veth}`);
      } else {
        try {
          rows.push(...(await measurePath(veth.namespaces, source, destination, opts)));
        } finally {
          veth.remove();
        }
      }
    } else {
      notes.push("veth netns path skipped: --no-netns");
    }
  } finally {
    source.free();
    destination.free();
  }
  const packing = measurePacking(opts);

  if (opts.json) {
    process.stdout.write(
      `${JSON.stringify({ bytes: opts.size, streams: opts.streams, chunk: opts.chunk, rounds: opts.rounds, transfers: rows, packing, notes })}\n`,
    );
    return 0;
  }
  const gib = (bytes: number): string => `${(bytes / GiB).toFixed(2)} GiB`;
  process.stdout.write(
    [
      `transfer of ${gib(opts.size)} staging → staging, engine: ${opts.streams} streams × ${opts.chunk / MiB} MiB chunks with CRC32C; median of ${opts.rounds}`,
      table(
        ["path", "method", "seconds", "Gbit/s", "vs plain socket"],
        rows.map((r) => [r.path, r.method, r.seconds.toFixed(3), r.gbps.toFixed(2), r.ratio.toFixed(2)]),
      ),
      ...notes,
      "",
      `checkpoint packing of ${gib(packing.bytes)} in ${packing.tensors} tensors into staging`,
      table(
        ["method", "GB/s", "vs memcpy"],
        [
          ["memcpy (Uint8Array.set)", packing.memcpyGBps.toFixed(2), "1.00"],
          ["copy + CRC32C (native)", packing.copyCrcGBps.toFixed(2), (packing.copyCrcGBps / packing.memcpyGBps).toFixed(2)],
          ["packCheckpoint", packing.packGBps.toFixed(2), packing.ratio.toFixed(2)],
        ],
      ),
    ].join("\n") + "\n",
  );
  return 0;
}

await benchMain("transfer", help, options, main);
