#!/usr/bin/env node
// A standalone fast.v1 simulator server in Node.js: a 2-D point mass that must reach a target.
//
// No code generation: @grpc/proto-loader reads protos/fast/v1/simulator.proto (and the
// tensor.proto it imports) when the server starts; --protos DIR (or FAST_PROTOS) says where
// protos/ is, by default ../../protos from this file.
//
// The environment is the one of examples/python_sim/server.py, bit for bit:
//   observation  float32 [6] = x, y, vx, vy, target_x - x, target_y - y
//   action       float32 [2] in [-1, 1], an acceleration: v <- 0.9 v + 0.1 a, then p <- p + 0.1 v
//   reward       1 / (1 + 10 d^2), d the distance to the target; -1 on the step that leaves the arena
//   terminated   when |x| > 1 or |y| > 1; truncated after MAX_STEPS steps
//   clip c       the target position, drawn from c alone; the episode seed draws the start position,
//                so the same clip, seed and actions always give the same trajectory.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const os = require('os');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const ENV_ID = 'point-mass';
const SERVER_VERSION = '0.1.0 (examples/node_sim)';
const SERVICE = 'fast.v1.Simulator';
const NUM_CLIPS = 20;
const MAX_STEPS = 80;
const OBS_LOW = [-1.1, -1.1, -1.0, -1.0, -2.0, -2.0];
const OBS_HIGH = [1.1, 1.1, 1.0, 1.0, 2.0, 2.0];
const OBS_DIM = OBS_LOW.length;
const ACT_DIM = 2;
const MASK64 = (1n << 64n) - 1n;
const MAX_DIM = (1n << 31n) - 1n;
const MAX_RANK = 32;

function fail(message) {
  console.error(`node_sim: ${message}`);
  process.exit(2);
}

// -- arguments and protos ---------------------------------------------------------------------------

function parseArgs(argv) {
  const args = {
    host: '127.0.0.1',
    port: 0,
    slots: 8,
    grace: 5,
    protos: process.env.FAST_PROTOS || path.resolve(__dirname, '..', '..', 'protos'),
  };
  const usage =
    'usage: node server.js [--host 127.0.0.1] [--port 0 (picks a free one)] [--slots 8] [--grace 5] [--protos DIR]';
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (key === 'help' || key === 'h') {
      console.log(usage);
      process.exit(0);
    }
    if (!(key in args) || i + 1 >= argv.length) fail(`bad argument ${JSON.stringify(argv[i])}; ${usage}`);
    args[key] = ['port', 'slots', 'grace'].includes(key) ? Number(argv[i + 1]) : argv[i + 1];
  }
  if (!Number.isInteger(args.port) || args.port < 0 || args.port > 65535) fail('--port must be in 0..65535');
  if (!Number.isInteger(args.slots) || args.slots < 1 || args.slots > 65536) fail('--slots must be in 1..65536');
  if (!(args.grace >= 0)) fail('--grace must be >= 0');
  return args;
}

// int64 fields arrive as decimal strings (longs: String), so no value loses precision.
const LOAD_OPTIONS = { keepCase: true, longs: String, enums: Number, defaults: true, oneofs: true };

function loadProtos(protos) {
  let fastDefinition;
  try {
    fastDefinition = protoLoader.loadSync('fast/v1/simulator.proto', { ...LOAD_OPTIONS, includeDirs: [protos] });
  } catch (error) {
    fail(`cannot load fast/v1/simulator.proto from ${protos} (${error.message}); give --protos DIR`);
  }
  const healthDefinition = protoLoader.loadSync(path.join(__dirname, 'health.proto'), LOAD_OPTIONS);
  const enumValues = (name) =>
    Object.fromEntries(fastDefinition[name].type.value.map((value) => [value.name, value.number]));
  return {
    simulator: grpc.loadPackageDefinition(fastDefinition).fast.v1.Simulator,
    health: grpc.loadPackageDefinition(healthDefinition).grpc.health.v1.Health,
    DType: enumValues('fast.v1.DType'),
    SpaceKind: enumValues('fast.v1.SpaceKind'),
  };
}

// -- the environment --------------------------------------------------------------------------------

// One step of SplitMix64: [next state, output]. Same integers in every language.
function splitmix64(state) {
  state = (state + 0x9e3779b97f4a7c15n) & MASK64;
  let z = state;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  return [state, z ^ (z >> 31n)];
}

class Rng {
  constructor(seed) {
    this.state = BigInt.asUintN(64, seed);
  }

  uniform(low, high) {
    const [state, z] = splitmix64(this.state);
    this.state = state;
    return low + (high - low) * (Number(z >> 11n) * 2 ** -53);
  }
}

function clipTarget(clip) {
  const rng = new Rng(clip * 0x100000001b3n + 0xc11fn);
  const tx = rng.uniform(-0.6, 0.6);
  return [tx, rng.uniform(-0.6, 0.6)];
}

// One slot's episode; `ended` after the step that ended it.
class Slot {
  constructor(clip, seed) {
    this.clip = clip; // BigInt
    [this.tx, this.ty] = clipTarget(clip);
    const rng = new Rng(splitmix64(BigInt.asUintN(64, clip))[1] ^ BigInt.asUintN(64, seed));
    this.x = rng.uniform(-0.8, 0.8);
    this.y = rng.uniform(-0.8, 0.8);
    this.vx = 0.0;
    this.vy = 0.0;
    this.t = 0;
    this.ret = 0.0;
    this.minD = this.distance();
    this.ended = false;
  }

  distance() {
    const dx = this.tx - this.x;
    const dy = this.ty - this.y;
    return Math.sqrt(dx * dx + dy * dy);
  }

  observation() {
    return [this.x, this.y, this.vx, this.vy, this.tx - this.x, this.ty - this.y];
  }

  // [reward (rounded to float32 as sent), terminated, truncated]
  step(ax, ay) {
    this.vx = 0.9 * this.vx + 0.1 * ax;
    this.vy = 0.9 * this.vy + 0.1 * ay;
    this.x = this.x + 0.1 * this.vx;
    this.y = this.y + 0.1 * this.vy;
    this.t += 1;
    const out = Math.abs(this.x) > 1.0 || Math.abs(this.y) > 1.0;
    const dx = this.tx - this.x;
    const dy = this.ty - this.y;
    const d2 = dx * dx + dy * dy;
    this.minD = Math.min(this.minD, Math.sqrt(d2));
    const reward = Math.fround(out ? -1.0 : 1.0 / (1.0 + 10.0 * d2));
    this.ret += reward;
    this.ended = out || this.t >= MAX_STEPS;
    return [reward, out, this.ended && !out];
  }

  summary(slotId, terminated) {
    return {
      slot_id: slotId,
      clip_id: this.clip.toString(),
      length: this.t,
      episode_return: this.ret,
      terminated,
      metrics: {
        final_distance: this.distance(),
        min_distance: this.minD,
        reached: this.minD < 0.1 ? 1.0 : 0.0,
        out_of_bounds: terminated ? 1.0 : 0.0,
      },
    };
  }
}

// -- tensors and refusals ---------------------------------------------------------------------------

class Refusal extends Error {
  constructor(code, details) {
    super(details);
    this.code = code;
    this.details = details;
  }
}

const invalid = (details) => new Refusal(grpc.status.INVALID_ARGUMENT, details);

// At most `limit` characters of what a client sent, never a whole value.
function quote(text, limit = 80) {
  text = String(text);
  return text.length <= limit ? text : `${text.slice(0, limit - 3)}...`;
}

const shapeText = (shape) => `[${shape.join(', ')}]`;

class Tensors {
  constructor(DType) {
    this.DType = DType;
    this.sizes = new Map([
      [DType.DTYPE_FLOAT32, 4],
      [DType.DTYPE_FLOAT64, 8],
      [DType.DTYPE_INT32, 4],
      [DType.DTYPE_INT64, 8],
      [DType.DTYPE_BOOL, 1],
      [DType.DTYPE_UINT8, 1],
    ]);
    this.names = new Map(Object.entries(DType).map(([name, number]) => [number, name]));
  }

  float32(values, shape) {
    const data = Buffer.alloc(4 * values.length);
    values.forEach((value, i) => data.writeFloatLE(value, 4 * i));
    return { dtype: this.DType.DTYPE_FLOAT32, shape, data };
  }

  bool(values) {
    return { dtype: this.DType.DTYPE_BOOL, shape: [values.length], data: Buffer.from(values.map(Number)) };
  }

  // The shape (BigInt dimensions) of a tensor that decodes; a Refusal naming `field` otherwise.
  check(tensor, field) {
    const t = tensor || { dtype: 0, shape: [], data: Buffer.alloc(0) };
    const size = this.sizes.get(t.dtype);
    if (size === undefined) throw invalid(`${field}.dtype: ${quote(t.dtype)} is not a known DType`);
    if (t.shape.length > MAX_RANK) throw invalid(`${field}.shape has ${t.shape.length} dimensions; at most ${MAX_RANK}`);
    const shape = t.shape.map((d) => BigInt(d));
    if (shape.some((d) => d < 0n || d > MAX_DIM)) {
      throw invalid(`${field}.shape ${quote(shapeText(shape))}: every dimension must be in 0..${MAX_DIM}`);
    }
    const count = shape.reduce((a, b) => a * b, 1n); // BigInt: exact, never wraps around
    if (count * BigInt(size) !== BigInt(t.data.length)) {
      throw invalid(
        `${field}: shape ${quote(shapeText(shape))} needs ${count * BigInt(size)} bytes, data has ${t.data.length}`,
      );
    }
    if (t.dtype === this.DType.DTYPE_BOOL && t.data.some((b) => b > 1)) {
      throw invalid(`${field}: BOOL data holds bytes other than 0 and 1`);
    }
    return shape;
  }

  // The actions of a checked tensor as numbers, [k * ACT_DIM], each within the action space.
  actions(tensor, shape, slotIds) {
    const k = slotIds.length;
    if (tensor.dtype !== this.DType.DTYPE_FLOAT32 || shape.length !== 2 || shape[0] !== BigInt(k) || shape[1] !== 2n) {
      const got = this.names.get(tensor.dtype).replace('DTYPE_', '').toLowerCase();
      throw invalid(
        `actions: expected shape [${k}, ${ACT_DIM}] (${k} slots x action shape [${ACT_DIM}]) of float32, ` +
          `got shape ${quote(shapeText(shape))} of ${got}`,
      );
    }
    const actions = [];
    for (let i = 0; i < k * ACT_DIM; i++) actions.push(tensor.data.readFloatLE(4 * i));
    slotIds.forEach((s, j) => {
      const row = actions.slice(j * ACT_DIM, (j + 1) * ACT_DIM);
      if (!row.every(Number.isFinite)) {
        throw invalid(`slot ${s}: action ${quote(shapeText(row))} is not finite; send finite values of shape [2]`);
      }
      row.forEach((a, e) => {
        if (!(a >= -1.0 && a <= 1.0)) {
          throw invalid(
            `slot ${s}: action element ${e} = ${a} is outside its bounds [-1.0, 1.0]; clip actions to the action space`,
          );
        }
      });
    });
    return actions;
  }
}

// -- the service ------------------------------------------------------------------------------------

// Node runs one callback at a time, so each call (and each message of a stream) is handled whole:
// it sees every slot as the previous one left it, and a refused call has changed nothing (every
// check runs before the first change).
class PointMassSimulator {
  constructor(numSlots, protos) {
    this.numSlots = numSlots;
    this.slots = new Array(numSlots).fill(null);
    this.tensors = new Tensors(protos.DType);
    this.SpaceKind = protos.SpaceKind;
  }

  describe() {
    const box = (low, high) => ({
      kind: this.SpaceKind.SPACE_KIND_BOX,
      shape: [low.length],
      dtype: this.tensors.DType.DTYPE_FLOAT32,
      low: this.tensors.float32(low, [low.length]),
      high: this.tensors.float32(high, [high.length]),
    });
    return {
      env_id: ENV_ID,
      observation_space: box(OBS_LOW, OBS_HIGH),
      action_space: box([-1.0, -1.0], [1.0, 1.0]),
      num_slots: this.numSlots,
      num_clips: NUM_CLIPS,
      capabilities: { batched_reset: true, streaming_step: true, cost_model: { preset: 'off' } },
      server_version: SERVER_VERSION,
      api_version: 'fast.v1',
    };
  }

  checkSlots(slotIds) {
    if (slotIds.length === 0) throw invalid('slot_ids is empty; name at least one slot');
    for (const s of slotIds) {
      if (!(s >= 0 && s < this.numSlots)) {
        throw new Refusal(
          grpc.status.NOT_FOUND,
          `slot ${s} does not exist; this server has slots 0..${this.numSlots - 1}`,
        );
      }
    }
    const seen = new Set();
    for (const s of slotIds) {
      if (seen.has(s)) throw invalid(`slot ${s} appears twice in slot_ids`);
      seen.add(s);
    }
  }

  reset(request, call) {
    const started = process.hrtime.bigint();
    const { slot_ids: slotIds, clip_ids: clipIds, seeds } = request;
    this.checkSlots(slotIds);
    if (clipIds.length !== slotIds.length) {
      throw invalid(`clip_ids has ${clipIds.length} entries for ${slotIds.length} slot_ids; give one clip per slot`);
    }
    if (seeds.length !== 0 && seeds.length !== slotIds.length) {
      throw invalid(`seeds has ${seeds.length} entries for ${slotIds.length} slot_ids; give one per slot or none`);
    }
    slotIds.forEach((s, j) => {
      const c = BigInt(clipIds[j]);
      if (c < 0n || c >= BigInt(NUM_CLIPS)) {
        throw new Refusal(
          grpc.status.NOT_FOUND,
          `slot ${s}: clip ${c} does not exist; the catalog has clips 0..${NUM_CLIPS - 1}`,
        );
      }
    });
    checkDeadline(call);
    const observations = [];
    slotIds.forEach((s, j) => {
      this.slots[s] = new Slot(BigInt(clipIds[j]), seeds.length ? BigInt(seeds[j]) : 0n);
      observations.push(...this.slots[s].observation());
    });
    return {
      slot_ids: slotIds,
      observations: this.tensors.float32(observations, [slotIds.length, OBS_DIM]),
      timing: { compute_s: secondsSince(started) },
    };
  }

  step(request, call) {
    const started = process.hrtime.bigint();
    const slotIds = request.slot_ids;
    const k = slotIds.length;
    const shape = this.tensors.check(request.actions, 'actions'); // the order of checks of fast sim-server
    this.checkSlots(slotIds);
    for (const s of slotIds) {
      const slot = this.slots[s];
      if (slot === null || slot.ended) {
        const why = slot === null ? 'it was never reset' : 'its episode ended';
        throw new Refusal(grpc.status.FAILED_PRECONDITION, `slot ${s} has no live episode (${why}); Reset it first`);
      }
    }
    const actions = this.tensors.actions(request.actions, shape, slotIds);
    checkDeadline(call);
    const observations = [];
    const rewards = [];
    const terminated = [];
    const truncated = [];
    const episodes = [];
    slotIds.forEach((s, j) => {
      const slot = this.slots[s];
      const [reward, term, trunc] = slot.step(actions[j * ACT_DIM], actions[j * ACT_DIM + 1]);
      observations.push(...slot.observation());
      rewards.push(reward);
      terminated.push(term);
      truncated.push(trunc);
      if (term || trunc) episodes.push(slot.summary(s, term));
    });
    return {
      slot_ids: slotIds,
      observations: this.tensors.float32(observations, [k, OBS_DIM]),
      rewards: this.tensors.float32(rewards, [k]),
      terminated: this.tensors.bool(terminated),
      truncated: this.tensors.bool(truncated),
      episodes,
      timing: { compute_s: secondsSince(started) },
      request_id: request.request_id,
    };
  }
}

const secondsSince = (started) => Number(process.hrtime.bigint() - started) / 1e9;

function checkDeadline(call) {
  const deadline = call.getDeadline();
  const ms = deadline instanceof Date ? deadline.getTime() : Number(deadline);
  if (Number.isFinite(ms) && ms <= Date.now()) {
    throw new Refusal(grpc.status.DEADLINE_EXCEEDED, "the call's deadline passed; no slot was changed");
  }
}

function statusOf(error) {
  if (error instanceof Refusal) return { code: error.code, details: error.details };
  console.error('node_sim: internal error:', error);
  return { code: grpc.status.INTERNAL, details: 'internal error of the simulator server' };
}

// -- the run token ----------------------------------------------------------------------------------

// FAST's convention (docs/security.md): FAST_AUTH_TOKEN, else the file named by FAST_AUTH_TOKEN_FILE,
// else the default file $FAST_HOME/token (~/.fast/token).
function runToken() {
  const value = process.env.FAST_AUTH_TOKEN;
  const file = process.env.FAST_AUTH_TOKEN_FILE;
  if (value !== undefined && file !== undefined) fail('both FAST_AUTH_TOKEN and FAST_AUTH_TOKEN_FILE are set; set one');
  let token;
  let source = 'FAST_AUTH_TOKEN';
  if (value !== undefined) {
    token = value.trim();
  } else {
    source = file || path.join(process.env.FAST_HOME || path.join(os.homedir(), '.fast'), 'token');
    try {
      token = fs.readFileSync(source, 'utf8').trim();
    } catch (error) {
      fail(`cannot read the run token from ${source} (${error.code}); set FAST_AUTH_TOKEN(_FILE)`);
    }
  }
  if (!/^[\x21-\x7e]+$/.test(token)) fail(`${source} holds an empty token or one a gRPC header cannot carry`);
  return token;
}

const digest = (text) => crypto.createHash('sha256').update(text).digest();

// Wraps each fast.v1 handler (health is left open): UNAUTHENTICATED unless the call carries `authorization: Bearer
// <token>`. Both sides are hashed first, so timingSafeEqual compares equal lengths in constant time.
function tokenCheck(token) {
  const expected = digest(token);
  const refusal = (call) => {
    const [value] = call.metadata.get('authorization');
    const [scheme, ...rest] = String(value ?? '').trim().split(' ');
    const presented = scheme.toLowerCase() === 'bearer' ? rest.join(' ').trim() : '';
    if (presented && crypto.timingSafeEqual(digest(presented), expected)) return null;
    const details = `${presented ? 'wrong' : 'no'} run token: send metadata 'authorization: Bearer <token>'`;
    return { code: grpc.status.UNAUTHENTICATED, details };
  };
  return {
    unary: (handle) => (call, callback) => {
      const refused = refusal(call);
      if (refused) return callback(refused);
      let answer;
      try {
        answer = handle(call.request, call);
      } catch (error) {
        return callback(statusOf(error));
      }
      return callback(null, answer);
    },
    // One answer per request, in order; an error ends the stream with its status.
    duplex: (handle) => (call) => {
      const refused = refusal(call);
      if (refused) return call.emit('error', refused);
      let over = false;
      call.on('data', (request) => {
        if (over) return;
        try {
          call.write(handle(request, call));
        } catch (error) {
          over = true;
          call.emit('error', statusOf(error));
        }
      });
      call.on('end', () => {
        if (!over) call.end();
        over = true;
      });
      call.on('cancelled', () => {
        over = true;
      });
    },
  };
}

// -- health -----------------------------------------------------------------------------------------

const SERVING = 1;
const NOT_SERVING = 2;
const SERVICE_UNKNOWN = 3;

class Health {
  constructor(services) {
    this.statuses = new Map(services.map((name) => [name, SERVING]));
    this.watchers = new Set();
  }

  handlers() {
    return {
      Check: (call, callback) => {
        const status = this.statuses.get(call.request.service);
        if (status === undefined) {
          return callback({ code: grpc.status.NOT_FOUND, details: `unknown service ${quote(call.request.service)}` });
        }
        return callback(null, { status });
      },
      Watch: (call) => {
        this.watchers.add(call);
        call.on('cancelled', () => this.watchers.delete(call));
        call.write({ status: this.statuses.get(call.request.service) ?? SERVICE_UNKNOWN });
      },
    };
  }

  // Every service NOT_SERVING, and the watch streams ended (so they do not hold up the shutdown).
  shutDown() {
    for (const name of this.statuses.keys()) this.statuses.set(name, NOT_SERVING);
    for (const call of this.watchers) {
      call.write({ status: this.statuses.get(call.request.service) ?? SERVICE_UNKNOWN });
      call.end();
    }
    this.watchers.clear();
  }
}

// -- the process ------------------------------------------------------------------------------------

function main() {
  const args = parseArgs(process.argv.slice(2));
  const protos = loadProtos(args.protos);
  const check = tokenCheck(runToken());
  const simulator = new PointMassSimulator(args.slots, protos);
  const health = new Health(['', SERVICE]);

  const server = new grpc.Server();
  server.addService(protos.simulator.service, {
    Describe: check.unary(() => simulator.describe()),
    Reset: check.unary((request, call) => simulator.reset(request, call)),
    Step: check.unary((request, call) => simulator.step(request, call)),
    StepStream: check.duplex((request, call) => simulator.step(request, call)),
  });
  server.addService(protos.health.service, health.handlers());

  const host = args.host.includes(':') ? `[${args.host}]` : args.host;
  server.bindAsync(`${host}:${args.port}`, grpc.ServerCredentials.createInsecure(), (error, port) => {
    if (error) fail(`cannot bind ${host}:${args.port}: ${error.message}`);
    console.log(`node_sim listening on ${host}:${port} env=${ENV_ID} slots=${args.slots}`);
  });

  // SIGTERM (or SIGINT): probes see NOT_SERVING at once, calls in flight get --grace seconds to
  // finish, then whatever is still open is cut; exit 0 either way.
  let stopping = false;
  const drain = () => {
    if (stopping) return;
    stopping = true;
    health.shutDown();
    const cut = setTimeout(() => {
      server.forceShutdown();
      process.exit(0);
    }, args.grace * 1000);
    server.tryShutdown(() => {
      clearTimeout(cut);
      process.exit(0);
    });
  };
  process.on('SIGTERM', drain);
  process.on('SIGINT', drain);
}

main();
