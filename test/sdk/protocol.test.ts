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
  type Directive,
  type Register,
  type Request,
} from "../../sdk/protocol/index.ts";
import { MAX_HOSTS, MAX_ID_LENGTH } from "../../sdk/protocol/limits.ts";
import { BarrierSchema, DirectiveReplySchema, isPlainBarrier, isPlainContinue } from "../../sdk/protocol/worker.ts";

const register = {
  v: 1,
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
    expect(PROTOCOL_VERSION).toBe(1);
  });

  it("rejects another protocol version with a clear error that keeps the request id", () => {
    const result = safeDecodeRequest(JSON.stringify({ ...register, v: 2 }));
    expect(result.success).toBe(false);
    if (result.success) return;
    expect(result.id).toBe(3);
    expect(result.error).toBeInstanceOf(ProtocolError);
    expect(result.error.code).toBe("unsupported_version");
    expect(result.error.message).toMatchInlineSnapshot(`"protocol version 2 is not supported: this side speaks version 1; upgrade the older side"`);
  });

  it("names unknown message types and lists the known ones", () => {
    const result = safeDecodeRequest(JSON.stringify({ v: 1, type: "worker.teleport", id: 9 }));
    expect(result).toMatchObject({ success: false, id: 9, error: { code: "unknown_type" } });
    if (!result.success) expect(result.error.message).toMatch(/^unknown request type "worker.teleport"; expected one of worker.register, worker.barrier, /);
  });

  it("rejects malformed frames, naming the field", () => {
    const cases: [string, string][] = [
      ["{not json", "the request is not JSON"],
      [JSON.stringify({ type: "status", id: 1 }), "request envelope at v: v is the protocol version, a whole number"],
      [JSON.stringify({ ...register, parallelism: { tp: 0, pp: 2, dp: 4 } }), "worker.register at parallelism.tp: parallelism.tp must be at least 1"],
      [JSON.stringify({ ...register, worker: { job: "llama", group: 1, host: -1 } }), "worker.register at worker.host: host indices start at 0"],
      [JSON.stringify({ ...register, extra: true }), 'worker.register: unknown field "extra"; remove it or check its spelling'],
      [JSON.stringify({ v: 1, type: "worker.barrier", id: 4, worker: register.worker, step: 3 }), "worker.barrier at generation: generation must be a whole number"],
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

  it("decodes directive replies as a union keyed by kind", () => {
    const reply = { v: 1, type: "worker.directive", id: 5, directive: { kind: "migrate-out", migration: "p0/0", to: 3, endpoint: "tcp://h3:7000", token: "t", step: 40 } };
    const result = safeDecodeReply(JSON.stringify(reply));
    expect(result).toEqual({ success: true, data: reply });
    expectTypeOf<Extract<Directive, { kind: "migrate-out" }>["token"]>().toEqualTypeOf<string>();
    expect(safeDecodeReply(JSON.stringify({ ...reply, directive: { kind: "teleport" } })).success).toBe(false);
  });
});

describe("barriers and their usual answer checked without zod", () => {
  const barrier = { v: 1, type: "worker.barrier", id: 7, worker: { job: "job-1", group: 0, host: 5 }, step: 3, generation: 0 };
  const answer = { v: 1, type: "worker.directive", id: 7, directive: { kind: "continue" } };
  const edges: unknown[] = [
    undefined, null, true, "1", [], {}, [1], -1, -0, 0.5, 1, 2, MAX_HOSTS - 1, MAX_HOSTS, 2 ** 53 - 1, 2 ** 53, Number.MAX_VALUE,
    "", "a", "x".repeat(MAX_ID_LENGTH), "x".repeat(MAX_ID_LENGTH + 1), "job 1", "job\n1", "jöb", "a.b_c:d@e+f=g/h-i",
    "worker.barrier", "worker.directive", "continue", "stop", { kind: "continue" }, { kind: "stop", reason: "r" },
  ];
  /** `message`, and copies with each field set to each edge value, deleted, or beside an extra field. */
  function variants(message: Record<string, unknown>): unknown[] {
    const out: unknown[] = [message, ...edges];
    const set = (path: readonly string[], value: unknown, remove = false) => {
      const copy = structuredClone(message);
      const parent = path.slice(0, -1).reduce((o, k) => o[k] as Record<string, unknown>, copy);
      if (remove) delete parent[path.at(-1)!];
      else parent[path.at(-1)!] = value;
      out.push(copy);
    };
    const paths = (o: Record<string, unknown>, at: string[] = []): string[][] =>
      Object.entries(o).flatMap(([k, v]) => [[...at, k], ...(typeof v === "object" && v !== null ? paths(v as Record<string, unknown>, [...at, k]) : [])]);
    for (const path of paths(message)) {
      set(path, undefined, true);
      for (const value of edges) set(path, value);
      if (path.length > 1) set([...path.slice(0, -1), "extra"], 1);
    }
    set(["extra"], 1);
    // A "__proto__" key in JSON is an own field, which a strict schema refuses.
    for (const key of Object.keys(message)) out.push(JSON.parse(JSON.stringify(message).replace(`"${key}"`, `"__proto__":{},"${key}"`)));
    return out;
  }
  const cases = [
    { name: "barrier", message: barrier, check: isPlainBarrier, schema: BarrierSchema, accepted: 20 },
    { name: "continue", message: answer, check: isPlainContinue, schema: DirectiveReplySchema, accepted: 5 },
  ];

  it.each(cases)("$name: accepts only what the schema accepts, and every well-formed one", ({ message, check, schema, accepted }) => {
    const all = variants(message);
    expect(all.length).toBeGreaterThan(150);
    const wrong = all.filter((value) => check(value) && !schema.safeParse(value).success);
    expect(wrong).toEqual([]);
    // Among the variants the schema accepts, only other directives (checked by the schema) are left to it.
    const missed = all.filter((value) => !check(value) && schema.safeParse(value).success && (value as { directive?: { kind?: string } }).directive?.kind !== "stop");
    expect(missed).toEqual([]);
    expect(all.filter((value) => check(value)).length).toBeGreaterThan(accepted);
  });

  it("decodes a barrier and its answer to what the schemas give, and a bad one to the schema's error", () => {
    expect(decodeRequest(JSON.stringify(barrier))).toEqual(BarrierSchema.parse(barrier));
    expect(safeDecodeReply(JSON.stringify(answer))).toEqual({ success: true, data: DirectiveReplySchema.parse(answer) });
    const bad = safeDecodeRequest(JSON.stringify({ ...barrier, worker: { ...barrier.worker, host: MAX_HOSTS } }));
    expect(bad.success).toBe(false);
    if (bad.success) return;
    expect(bad.id).toBe(7);
    expect(bad.error.message).toMatch(/worker\.host/);
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
      Buffer.from(JSON.stringify({ v: 1, type: "daemon.register", id: 1, host: 0, incarnation: "0".repeat(32), stagingBytes: 1, endpoint: "tcp://h:0" })),
    );
    expect(decoded.success).toBe(false);
    if (!decoded.success) expect(decoded.error.message).toMatch(/endpoint must be tcp:\/\/HOST:PORT/);
  });
});
