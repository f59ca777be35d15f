import { describe, expect, expectTypeOf, it } from "vitest";
import {
  decodeRequest,
  formatTransferEndpoint,
  parseTransferEndpoint,
  encode,
  PROTOCOL_VERSION,
  ProtocolError,
  safeDecodeReply,
  safeDecodeRequest,
  HOLD_PHASES,
  OrderMessageSchema,
  ReportSchema,
  type HoldPhase,
  type Order,
  type Register,
  type Report,
  type Request,
} from "../../sdk/contract/protocol/index.ts";
import { MAX_HOSTS, MAX_ID_LENGTH } from "../../sdk/contract/protocol/limits.ts";

const register = {
  v: PROTOCOL_VERSION,
  type: "worker.register",
  id: 3,
  worker: { job: "llama", group: 1, host: 12 },
  parallelism: { tp: 8, pp: 2, dp: 4 },
  checkpointBytes: 12_000_000_000,
};

describe("protocol", () => {
  it("decodes a request into its inferred type and encodes it back unchanged", () => {
    const decoded = decodeRequest(Buffer.from(JSON.stringify(register)));
    expect(decoded).toEqual(register);
    expectTypeOf(decoded).toEqualTypeOf<Request>();
    if (decoded.type !== "worker.register") throw new Error("narrowing failed");
    expectTypeOf(decoded).toEqualTypeOf<Register>();
    expect(JSON.parse(encode(decoded))).toEqual(register);
    expect(PROTOCOL_VERSION).toBe(2);
  });

  it("rejects another protocol version with a clear error that keeps the request id", () => {
    const result = safeDecodeRequest(JSON.stringify({ ...register, v: 1 }));
    expect(result.success).toBe(false);
    if (result.success) return;
    expect(result.id).toBe(3);
    expect(result.error).toBeInstanceOf(ProtocolError);
    expect(result.error.code).toBe("unsupported_version");
    expect(result.error.message).toMatchInlineSnapshot(
      `"protocol version 1 is not supported: this controller speaks version 2; run the same MonkeyTree release on the controller, the daemons and the launchers"`,
    );
    // A client reading a reply of another version names itself.
    const reply = safeDecodeReply(JSON.stringify({ v: 3, type: "ack", id: 4 }));
    expect(reply).toMatchObject({ success: false, id: 4, error: { code: "unsupported_version" } });
    if (!reply.success) expect(reply.error.message).toMatch(/^protocol version 3 is not supported: this client speaks version 2; /);
  });

  it("names unknown message types and lists the known ones", () => {
    const result = safeDecodeRequest(JSON.stringify({ v: PROTOCOL_VERSION, type: "worker.teleport", id: 9 }));
    expect(result).toMatchObject({ success: false, id: 9, error: { code: "unknown_type" } });
    if (!result.success)
      expect(result.error.message).toMatch(/^unknown request type "worker.teleport"; expected one of worker.register, worker.report, job.finish, /);
  });

  it("rejects malformed frames, naming the field", () => {
    const cases: [string, string][] = [
      ["{not json", "the request is not JSON"],
      [JSON.stringify({ type: "status", id: 1 }), "request envelope at v: v is the protocol version, a whole number"],
      [JSON.stringify({ ...register, parallelism: { tp: 0, pp: 2, dp: 4 } }), "worker.register at parallelism.tp: parallelism.tp must be at least 1"],
      [JSON.stringify({ ...register, worker: { job: "llama", group: 1, host: -1 } }), "worker.register at worker.host: host indices start at 0"],
      [JSON.stringify({ ...register, extra: true }), 'worker.register: unknown field "extra"; remove it or check its spelling'],
      [
        JSON.stringify({ v: PROTOCOL_VERSION, type: "worker.report", id: 4, worker: register.worker, step: 3, stepMs: null, hold: null }),
        "worker.report at generation: generation must be a whole number",
      ],
    ];
    for (const [frame, message] of cases) {
      const result = safeDecodeRequest(frame);
      expect(result.success).toBe(false);
      if (!result.success) {
        expect(result.error.code).toBe("malformed");
        expect(result.error.message.startsWith(message)).toBe(true);
      }
    }
  });

  it("decodes order replies as a union keyed by kind", () => {
    const reply = {
      v: PROTOCOL_VERSION,
      type: "worker.order",
      id: 5,
      worker: register.worker,
      order: { kind: "migrate-out", stop: "s1", migration: "p0/0", to: 3, endpoint: "tcp://h3:7000", token: "t", step: 40 },
    };
    const result = safeDecodeReply(JSON.stringify(reply));
    expect(result).toEqual({ success: true, data: reply });
    expectTypeOf<Extract<Order, { kind: "migrate-out" }>["token"]>().toEqualTypeOf<string>();
    expect(safeDecodeReply(JSON.stringify({ ...reply, order: { kind: "teleport" } })).success).toBe(false);
    // The version-1 barrier answer is no longer a reply.
    expect(safeDecodeReply(JSON.stringify({ v: PROTOCOL_VERSION, type: "worker.directive", id: 5, directive: { kind: "continue" } }))).toMatchObject({
      success: false,
      error: { code: "unknown_type" },
    });
  });
});

describe("reports and orders, checked by their schemas", () => {
  const worker = { job: "job-1", group: 0, host: 5 };
  const report = {
    v: PROTOCOL_VERSION,
    type: "worker.report",
    id: 7,
    worker,
    generation: 2,
    step: 3,
    stepMs: 125.5,
    hold: { stop: "s1", step: 4, phase: "armed" },
  };
  const order = { v: PROTOCOL_VERSION, type: "worker.order", id: 0, worker, order: { kind: "stop-at", stop: "s1", step: 4 } };
  const edges: unknown[] = [
    undefined,
    null,
    true,
    "1",
    [],
    {},
    [1],
    -1,
    -0,
    0.5,
    1,
    2,
    MAX_HOSTS - 1,
    MAX_HOSTS,
    86_400_000,
    86_400_001,
    2 ** 53 - 1,
    2 ** 53,
    Number.MAX_VALUE,
    "",
    "a",
    "x".repeat(MAX_ID_LENGTH),
    "x".repeat(MAX_ID_LENGTH + 1),
    "job 1",
    "job\n1",
    "jöb",
    "a.b_c:d@e+f=g/h-i",
    "worker.report",
    "worker.order",
    "run",
    "stop",
    "held",
    { kind: "run" },
    { kind: "stop", reason: "r" },
    { stop: "s2", step: 9, phase: "sealed" },
  ];
  /** Copies of `message` with one field below the envelope set to each edge value, deleted, or beside an extra field. */
  function variants(message: Record<string, unknown>): { path: string[]; value: unknown }[] {
    const out: { path: string[]; value: unknown }[] = [];
    const set = (path: string[], value: unknown, remove = false) => {
      const copy = structuredClone(message);
      const parent = path.slice(0, -1).reduce((o, k) => o[k] as Record<string, unknown>, copy);
      if (remove) delete parent[path.at(-1)!];
      else parent[path.at(-1)!] = value;
      out.push({ path, value: copy });
    };
    const paths = (o: Record<string, unknown>, at: string[] = []): string[][] =>
      Object.entries(o).flatMap(([k, v]) => [[...at, k], ...(typeof v === "object" && v !== null ? paths(v as Record<string, unknown>, [...at, k]) : [])]);
    for (const path of paths(message).filter((p) => !["v", "type", "id"].includes(p[0]!))) {
      set(path, undefined, true);
      for (const value of edges) set(path, value);
      if (path.length > 1) set([...path.slice(0, -1), "extra"], 1);
    }
    set(["extra"], 1);
    return out;
  }
  /** Where a refusal must point: the field itself, or for an extra field or a union's kind, the object holding it. */
  const names = (message: string, type: string, path: string[]) =>
    message.startsWith(`${type} at ${path.join(".")}`) ||
    (["extra", "kind"].includes(path.at(-1)!) && message.startsWith(path.length > 1 ? `${type} at ${path.slice(0, -1).join(".")}` : `${type}: `));

  it("accepts a report before the first barrier, while training, and in every hold phase", () => {
    const fresh = { ...report, step: null, stepMs: null, hold: null };
    expect(ReportSchema.parse(fresh)).toEqual(fresh);
    expect(decodeRequest(JSON.stringify(fresh))).toEqual(fresh);
    for (const phase of HOLD_PHASES) {
      const holding = { ...report, hold: { ...report.hold, phase } };
      expect(decodeRequest(JSON.stringify(holding))).toEqual(ReportSchema.parse(holding));
    }
    expectTypeOf<Report["hold"]>().toEqualTypeOf<{ stop: string; step: number; phase: HoldPhase } | null>();
  });

  it("accepts every order kind, pushed (id 0) or answering a report", () => {
    const assignment = {
      job: "job-1",
      group: 0,
      host: 5,
      nodeRank: 1,
      nodes: 2,
      masterHost: 4,
      masterAddress: null,
      ringOrder: [4, 5],
      generation: 3,
      resumeStep: 4,
    };
    const orders: Order[] = [
      { kind: "run" },
      { kind: "stop-at", stop: "s1", step: 4 },
      { kind: "migrate-out", stop: "s1", migration: "p0/0", to: 3, endpoint: "tcp://h3:7000", token: "t", step: 4 },
      { kind: "seal", stop: "s1" },
      { kind: "reconfigure", assignment },
      { kind: "stop", reason: "the job finished" },
    ];
    for (const [id, one] of [0, 7].flatMap((id) => orders.map((o) => [id, o] as const))) {
      const message = { ...order, id, order: one };
      expect(OrderMessageSchema.parse(message)).toEqual(message);
      expect(safeDecodeReply(JSON.stringify(message))).toEqual({ success: true, data: message });
    }
  });

  it.each([
    ["generation", { generation: -1 }, "worker.report at generation: generation must not be negative"],
    ["step", { step: 1.5 }, "worker.report at step: step must be a whole number"],
    ["stepMs", { stepMs: -1 }, "worker.report at stepMs: stepMs must not be negative"],
    ["stepMs", { stepMs: 86_400_001 }, "worker.report at stepMs: stepMs must be at most 86400000"],
    ["hold.step", { hold: { stop: "s1", step: -1, phase: "held" } }, "worker.report at hold.step: hold.step must not be negative"],
    [
      "hold.phase",
      { hold: { stop: "s1", step: 4, phase: "frozen" } },
      "worker.report at hold.phase: hold.phase must be one of armed, held, saving, saved, sealed, released",
    ],
    ["worker.host", { worker: { ...worker, host: MAX_HOSTS } }, `worker.report at worker.host: host indices end at ${MAX_HOSTS - 1}`],
  ])("refuses a report whose %s is out of range, naming it, and keeps the request id", (_field, change, message) => {
    const result = safeDecodeRequest(JSON.stringify({ ...report, ...change }));
    expect(ReportSchema.safeParse({ ...report, ...change }).success).toBe(false);
    expect(result).toMatchObject({ success: false, id: 7, error: { code: "malformed" } });
    if (!result.success) expect(result.error.message.startsWith(message)).toBe(true);
  });

  it.each([
    ["order.step", { kind: "stop-at", stop: "s1", step: -1 }, "worker.order at order.step: step must not be negative"],
    [
      "order.to",
      { kind: "migrate-out", stop: "s1", migration: "p0/0", to: MAX_HOSTS, endpoint: "tcp://h3:7000", token: "t", step: 4 },
      "worker.order at order.to: host indices end at",
    ],
    ["order.stop", { kind: "seal", stop: "a b" }, "worker.order at order.stop: stop may hold only letters, digits"],
    ["order.kind", { kind: "continue" }, "worker.order at order.kind: "],
  ])("refuses an order whose %s is out of range, naming it", (_field, change, message) => {
    const bad = { ...order, order: change };
    expect(OrderMessageSchema.safeParse(bad).success).toBe(false);
    const result = safeDecodeReply(JSON.stringify(bad));
    expect(result).toMatchObject({ success: false, id: 0, error: { code: "malformed" } });
    if (!result.success) expect(result.error.message.startsWith(message)).toBe(true);
  });

  it.each([
    { name: "report", message: report, schema: ReportSchema, decode: safeDecodeRequest, accepted: 50 },
    { name: "order", message: order, schema: OrderMessageSchema, decode: safeDecodeReply, accepted: 30 },
  ])("$name: decodes what the schema accepts to the same data, and names the changed field of what it refuses", ({ message, schema, decode, accepted }) => {
    const all = variants(message);
    expect(all.length).toBeGreaterThan(150);
    const wrong: unknown[] = [];
    let passed = 0;
    for (const { path, value } of all) {
      const parsed = schema.safeParse(value);
      const result = decode(JSON.stringify(value));
      if (parsed.success) {
        passed++;
        if (!result.success || JSON.stringify(result.data) !== JSON.stringify(parsed.data)) wrong.push({ path, value, result });
      } else if (result.success || result.error.code !== "malformed" || !names(result.error.message, message.type, path)) {
        wrong.push({ path, value, result });
      }
    }
    expect(wrong).toEqual([]);
    expect(passed).toBeGreaterThan(accepted);
  });
});

describe("transfer endpoints", () => {
  it("round-trip host, port and the RDMA offer, IPv6 literals in brackets", () => {
    for (const endpoint of [
      { host: "10.0.0.5", port: 41234, rdma: false },
      { host: "h3", port: 7000, rdma: true },
      { host: "fe80::1", port: 1, rdma: true },
    ]) {
      const text = formatTransferEndpoint(endpoint);
      expect(parseTransferEndpoint(text)).toEqual(endpoint);
    }
    expect(formatTransferEndpoint({ host: "fe80::1", port: 9, rdma: true })).toBe("tcp://[fe80::1]:9?rdma");
  });

  it("refuse anything else, and a registration carrying one says how to fix it", () => {
    for (const bad of ["udp://h:1", "tcp://h", "tcp://h:0", "tcp://h:70000", "tcp://h:1?tcp", "tcp://a:b:1", "h:1"]) {
      expect(parseTransferEndpoint(bad)).toBeNull();
    }
    const decoded = safeDecodeRequest(
      Buffer.from(
        JSON.stringify({ v: PROTOCOL_VERSION, type: "daemon.register", id: 1, host: 0, incarnation: "0".repeat(32), stagingBytes: 1, endpoint: "tcp://h:0" }),
      ),
    );
    expect(decoded.success).toBe(false);
    if (!decoded.success) expect(decoded.error.message).toMatch(/endpoint must be tcp:\/\/HOST:PORT/);
  });
});
