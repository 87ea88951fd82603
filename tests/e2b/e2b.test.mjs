// The unmodified `e2b` SDK against SPACE's E2B-compatible API, written
// from the SDK's documented behaviour. run.sh starts a SPACE server with
// the API on :443 of 127.0.0.1 under the domain e2b.test (TLS with a CA
// of its own) and sets E2B_DOMAIN, E2B_API_KEY and NODE_EXTRA_CA_CERTS;
// hosts.cjs resolves every *.e2b.test name to 127.0.0.1.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import {
  Sandbox, CommandExitError, NotFoundError, FileType, FilesystemEventType,
} from 'e2b'

const RUN = Math.random().toString(36).slice(2, 10)
const META = { suite: 'e2b-sdk', run: RUN }
const opts = { metadata: META, timeoutMs: 10 * 60_000 }

let sbx
before(async () => {
  sbx = await Sandbox.create('base', opts)
})
after(async () => {
  // Whatever a failed test left behind.
  const p = Sandbox.list({ query: { metadata: { run: RUN } } })
  while (p.hasNext) {
    for (const s of await p.nextItems()) await Sandbox.kill(s.sandboxId).catch(() => {})
  }
})

test('create: an id the SDK accepts, and info', async () => {
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.deepEqual(info.metadata, META)
  assert.equal(info.state, 'running')
  assert.ok(info.endAt > info.startedAt)
  assert.equal(await sbx.isRunning(), true)
})

test('commands: run, exit codes, envs, cwd, user, stderr', async () => {
  const r = await sbx.commands.run('echo "$GREETING from $(whoami) in $(pwd)"; echo err >&2',
    { envs: { GREETING: 'hi' } })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hi from user in /home/user\n')
  assert.equal(r.stderr, 'err\n')
  assert.equal((await sbx.commands.run('id -un', { user: 'root', cwd: '/tmp' })).stdout, 'root\n')
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  assert.equal((await sbx.commands.run('sudo -n id -u')).stdout, '0\n')
  assert.equal((await sbx.commands.run('python --version && python3 -c "print(6*7)"')).stdout.split('\n')[1], '42')
  await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
  const lines = []
  await sbx.commands.run('for i in 1 2 3; do echo $i; done', { onStdout: (d) => lines.push(d) })
  assert.equal(lines.join(''), '1\n2\n3\n')
})

test('commands: a large output arrives byte-exact', async () => {
  const n = 8 << 20
  const r = await sbx.commands.run(`head -c ${n} /dev/zero | tr '\\0' a; echo`, {
    onStdout: () => {}, timeoutMs: 120_000,
  })
  const got = r.stdout
  assert.equal(got.length, n + 1)
  assert.equal(createHash('sha256').update(got).digest('hex'),
    createHash('sha256').update('a'.repeat(n) + '\n').digest('hex'))
})

test('commands: background, stdin, list, connect, kill', async () => {
  const h = await sbx.commands.run('read line; echo "got $line"; sleep 600', { background: true, stdin: true })
  assert.ok(h.pid > 0)
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === h.pid), JSON.stringify(listed))
  await sbx.commands.sendStdin(h.pid, 'hello\n')
  for (let i = 0; i < 100 && !h.stdout.includes('got hello'); i++) await new Promise((r) => setTimeout(r, 100))
  assert.equal(h.stdout, 'got hello\n')
  await h.disconnect()
  const again = await sbx.commands.connect(h.pid)
  assert.equal(await sbx.commands.kill(h.pid), true)
  await assert.rejects(again.wait(), (e) => e instanceof CommandExitError)
  assert.equal(await sbx.commands.kill(h.pid), false)

  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'to cat\n')
  await sbx.commands.closeStdin(cat.pid)
  const r = await cat.wait()
  assert.equal(r.stdout, 'to cat\n')

  // More than one request's worth of stdin, in order.
  const big = Buffer.alloc(3 << 20)
  for (let i = 0; i < big.length; i++) big[i] = 97 + (i % 26)
  const sum = await sbx.commands.run('sha256sum', { background: true, stdin: true })
  await sbx.commands.sendStdin(sum.pid, big)
  await sbx.commands.closeStdin(sum.pid)
  assert.equal((await sum.wait()).stdout.split(' ')[0], createHash('sha256').update(big).digest('hex'))
})

test('commands: every handle of a command receives its output', async () => {
  const h = await sbx.commands.run('while read line; do echo "got $line"; done', { background: true, stdin: true })
  const other = await sbx.commands.connect(h.pid)
  const wait = async (cond) => {
    for (let i = 0; i < 200 && !cond(); i++) await new Promise((r) => setTimeout(r, 100))
  }
  await sbx.commands.sendStdin(h.pid, 'one\n')
  await wait(() => h.stdout.includes('got one') && other.stdout.includes('got one'))
  assert.equal(h.stdout, 'got one\n')
  assert.equal(other.stdout, 'got one\n')
  // One handle leaving neither ends the command nor the other handle.
  await other.disconnect()
  await sbx.commands.sendStdin(h.pid, 'two\n')
  await wait(() => h.stdout.includes('got two'))
  assert.equal(h.stdout, 'got one\ngot two\n')
  const third = await sbx.commands.connect(h.pid)
  await sbx.commands.closeStdin(h.pid)
  const [r, r3] = await Promise.all([h.wait(), third.wait()])
  assert.equal(r.exitCode, 0)
  assert.equal(r3.exitCode, 0)
  assert.equal(r.stdout, 'got one\ngot two\n')
})

test('envd calls the SDK does not make: tagged processes and StreamInput', async () => {
  const envd = `https://${sbx.getHost(49983)}`
  const token = { 'X-Access-Token': sbx.envdAccessToken }
  const stream = { ...token, 'Content-Type': 'application/connect+json' }
  const unary = { ...token, 'Content-Type': 'application/json' }
  const envelope = (msg) => {
    const b = Buffer.from(JSON.stringify(msg))
    const h = Buffer.alloc(5)
    h.writeUInt32BE(b.length, 1)
    return Buffer.concat([h, b])
  }
  const frames = (buf) => {
    const out = []
    let b = Buffer.from(buf)
    while (b.length >= 5) {
      const n = b.readUInt32BE(1)
      out.push({ flags: b[0], msg: JSON.parse(b.subarray(5, 5 + n).toString()) })
      b = b.subarray(5 + n)
    }
    return out
  }
  const b64 = (s) => Buffer.from(s).toString('base64')

  // A tagged command, started the way envd's Start is called.
  const started = await fetch(`${envd}/process.Process/Start`, {
    method: 'POST', headers: stream,
    body: envelope({ process: { cmd: '/bin/bash', args: ['-c', 'cat > /tmp/streamed'] }, tag: 'sink', stdin: true }),
  })
  assert.equal(started.status, 200)
  const events = started.arrayBuffer() // the whole stream, once the command ends
  let listed
  for (let i = 0; i < 100; i++) {
    listed = (await sbx.commands.list()).find((p) => p.tag === 'sink')
    if (listed) break
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.ok(listed, 'the tagged command is listed with its tag')

  // Client-streamed input, found by tag, written in order.
  const { readable, writable } = new TransformStream()
  const reply = fetch(`${envd}/process.Process/StreamInput`, { method: 'POST', headers: stream, body: readable, duplex: 'half' })
  const w = writable.getWriter()
  await w.write(envelope({ start: { process: { tag: 'sink' } } }))
  await w.write(envelope({ data: { input: { stdin: b64('one ') } } }))
  await w.write(envelope({ keepalive: {} }))
  await w.write(envelope({ data: { input: { stdin: b64('two\n') } } }))
  await w.close()
  const res = await reply
  assert.equal(res.status, 200)
  assert.deepEqual(frames(await res.arrayBuffer()), [{ flags: 0, msg: {} }, { flags: 2, msg: {} }])

  // Unary calls by tag; an unknown tag is not found.
  const close = await fetch(`${envd}/process.Process/CloseStdin`, { method: 'POST', headers: unary, body: JSON.stringify({ process: { tag: 'sink' } }) })
  assert.equal(close.status, 200)
  const end = frames(await events).map((f) => f.msg)
  assert.deepEqual(end.at(-2), { event: { end: { exitCode: 0, exited: true, status: 'exit status 0' } } })
  assert.equal(await sbx.files.read('/tmp/streamed'), 'one two\n')
  const unknown = await fetch(`${envd}/process.Process/SendSignal`, {
    method: 'POST', headers: unary, body: JSON.stringify({ process: { tag: 'no-such-tag' }, signal: 'SIGNAL_SIGKILL' }),
  })
  assert.equal(unknown.status, 404)

  // Input before the process is named is refused, in the stream's end.
  const early = await fetch(`${envd}/process.Process/StreamInput`, {
    method: 'POST', headers: stream, body: envelope({ data: { input: { stdin: b64('x') } } }),
  })
  const [f] = frames(await early.arrayBuffer())
  assert.equal(f.flags, 2)
  assert.equal(f.msg.error.code, 'invalid_argument')
})

test('commands: a timeout kills the command', async () => {
  const t0 = Date.now()
  await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 2000 }))
  assert.ok(Date.now() - t0 < 20_000)
})

test('files: write, read, list, info, exists, makeDir, rename, remove', async () => {
  const info = await sbx.files.write('/home/user/dir/a.txt', 'alpha')
  assert.equal(info.path, '/home/user/dir/a.txt')
  assert.equal(await sbx.files.read('/home/user/dir/a.txt'), 'alpha')
  await sbx.files.write('rel.bin', new Uint8Array([0, 1, 2, 255]).buffer)
  const bytes = await sbx.files.read('/home/user/rel.bin', { format: 'bytes' })
  assert.deepEqual([...bytes], [0, 1, 2, 255])
  const multi = await sbx.files.write([{ path: '/tmp/m1', data: 'one' }, { path: '/tmp/m2', data: 'two' }])
  assert.deepEqual(multi.map((w) => w.path), ['/tmp/m1', '/tmp/m2'])
  assert.equal(await sbx.files.read('/tmp/m2'), 'two')

  const entries = await sbx.files.list('/home/user/dir')
  assert.deepEqual(entries.map((e) => [e.name, e.type]), [['a.txt', FileType.FILE]])
  const st = await sbx.files.getInfo('/home/user/dir/a.txt')
  assert.equal(st.size, 5)
  assert.equal(st.owner, 'user')
  assert.equal(st.permissions, '-rw-r--r--')
  assert.equal(await sbx.files.exists('/home/user/dir/a.txt'), true)
  assert.equal(await sbx.files.exists('/home/user/nope'), false)
  assert.equal(await sbx.files.makeDir('/home/user/dir/sub/deeper'), true)
  assert.equal(await sbx.files.makeDir('/home/user/dir/sub/deeper'), false)
  const deep = await sbx.files.list('/home/user/dir', { depth: 3 })
  assert.ok(deep.some((e) => e.path === '/home/user/dir/sub/deeper' && e.type === FileType.DIR))
  const moved = await sbx.files.rename('/home/user/dir/a.txt', '/home/user/dir/sub/b.txt')
  assert.equal(moved.path, '/home/user/dir/sub/b.txt')
  await sbx.files.remove('/home/user/dir')
  assert.equal(await sbx.files.exists('/home/user/dir'), false)
  await assert.rejects(sbx.files.read('/home/user/dir/sub/b.txt'), (e) => e instanceof NotFoundError)
  await assert.rejects(sbx.files.getInfo('/nope'), (e) => e instanceof NotFoundError)
})

test('files: what envd reports: modes, absolute link targets, order, metadata', async () => {
  await sbx.files.makeDir('/home/user/det/b')
  await sbx.files.write('/home/user/det/c.txt', 'c', { metadata: { author: 'me' } })
  await sbx.files.write('/home/user/det/a.txt', 'a')
  await sbx.commands.run('cd /home/user/det && ln -s a.txt link && mkdir b/x && python3 -c "import os; os.setxattr(\'a.txt\', \'user.e2b.kind\', b\'note\')"')
  const dir = await sbx.files.getInfo('/home/user/det')
  assert.deepEqual([dir.mode, dir.permissions], [0o755, 'drwxr-xr-x'])
  assert.equal((await sbx.files.getInfo('/home/user/det/link')).symlinkTarget, '/home/user/det/a.txt')
  assert.deepEqual((await sbx.files.list('/home/user/det', { depth: 2 })).map((e) => e.name),
    ['a.txt', 'b', 'x', 'c.txt', 'link'])
  assert.deepEqual((await sbx.files.getInfo('/home/user/det/c.txt')).metadata, { author: 'me' })
  assert.deepEqual((await sbx.files.getInfo('/home/user/det/a.txt')).metadata, { kind: 'note' })
  await sbx.files.remove('/home/user/det/never-was') // envd removes like rm -f
  await sbx.files.remove('/home/user/det')
})

test('files: watch a directory', async () => {
  await sbx.files.makeDir('/tmp/watched')
  const events = []
  const w = await sbx.files.watchDir('/tmp/watched', (e) => events.push(e), { recursive: true })
  await sbx.files.write('/tmp/watched/new.txt', 'x')
  await sbx.files.write('/tmp/watched/new.txt', 'overwritten')
  await sbx.commands.run('mkdir /tmp/watched/d && echo y > /tmp/watched/d/inner && rm /tmp/watched/new.txt')
  for (let i = 0; i < 100; i++) {
    if (events.some((e) => e.name === 'd/inner' && e.type === FilesystemEventType.WRITE) &&
      events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.REMOVE)) break
    await new Promise((r) => setTimeout(r, 100))
  }
  await w.stop()
  const seen = events.map((e) => `${e.type} ${e.name}`)
  for (const want of ['create new.txt', 'write new.txt', 'create d', 'write d/inner', 'remove new.txt']) {
    assert.ok(seen.includes(want), `${want} in ${JSON.stringify(seen)}`)
  }
  assert.ok(!seen.some((e) => e.includes('space-tmp')), `SPACE's temporary files stay out: ${JSON.stringify(seen)}`)
})

test('files: signed upload and download URLs', async () => {
  const up = await sbx.uploadUrl('/tmp/via-url.txt')
  const form = new FormData()
  form.append('file', new Blob(['uploaded by url']), '/tmp/via-url.txt')
  const res = await fetch(up, { method: 'POST', body: form })
  assert.equal(res.status, 200, await res.clone().text())
  const down = await sbx.downloadUrl('/tmp/via-url.txt')
  assert.equal(await (await fetch(down)).text(), 'uploaded by url')
  const forged = down.replace(/signature=[^&]+/, 'signature=v1_forged')
  assert.equal((await fetch(forged)).status, 401)
})

test('pty: input, resize, output', async () => {
  let out = ''
  const dec = new TextDecoder()
  const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
  await sbx.pty.resize(t.pid, { cols: 120, rows: 40 })
  await sbx.pty.sendInput(t.pid, new TextEncoder().encode('stty size; exit\n'))
  await t.wait()
  assert.match(out, /40 120/)
})

test('getHost: a server in the sandbox, through its host name', async () => {
  await sbx.files.write('/tmp/www/index.html', 'served')
  await sbx.commands.run('python3 -m http.server 8000 -d /tmp/www', { background: true })
  const url = `https://${sbx.getHost(8000)}/index.html`
  let res
  for (let i = 0; i < 100; i++) {
    res = await fetch(url)
    if (res.status === 200) break
    await new Promise((r) => setTimeout(r, 200))
  }
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'served')
  const closed = await fetch(`https://${sbx.getHost(8001)}/`)
  assert.equal(closed.status, 502)
  assert.equal((await closed.json()).code, 502)
})

test('routing by headers: one base URL for every sandbox', async () => {
  // As with E2B_SANDBOX_URL: envd requests carry E2b-Sandbox-Id instead of
  // naming the sandbox in the host.
  const same = await Sandbox.connect(sbx.sandboxId, { sandboxUrl: `https://${process.env.E2B_DOMAIN}` })
  assert.equal((await same.commands.run('echo via headers')).stdout, 'via headers\n')
  assert.equal(await same.files.read('/tmp/www/index.html'), 'served')
})

test('metrics: a sample of the guest', async () => {
  const [m] = await sbx.getMetrics()
  assert.ok(m.cpuCount >= 1 && m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, JSON.stringify(m))
  assert.ok(m.memTotal > 100 << 20 && m.memUsed > 0 && m.memUsed < m.memTotal, JSON.stringify(m))
  assert.ok(m.diskTotal > 0 && m.diskUsed > 0, JSON.stringify(m))
  assert.ok(m.timestamp instanceof Date)
  const hour = 3600_000
  assert.deepEqual(await sbx.getMetrics({ start: new Date(Date.now() - 2 * hour), end: new Date(Date.now() - hour) }), [])
})

test('snapshots: a sandbox started from one has its files', async () => {
  await sbx.files.write('/home/user/snap.txt', 'kept')
  const snap = await sbx.createSnapshot()
  try {
    const copy = await Sandbox.create(snap.snapshotId, opts)
    try {
      assert.equal(await copy.files.read('/home/user/snap.txt'), 'kept')
    } finally {
      await copy.kill()
    }
  } finally {
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  }
})

test('timeouts: set, extend and shorten', async () => {
  await sbx.setTimeout(30 * 60_000)
  let info = await sbx.getInfo()
  assert.ok(info.endAt.getTime() - Date.now() > 25 * 60_000)
  await sbx.setTimeout(10 * 60_000)
  info = await sbx.getInfo()
  assert.ok(info.endAt.getTime() - Date.now() < 11 * 60_000)
})

test('pause and resume keep processes, files and a running server', async () => {
  const other = await Sandbox.create('base', { ...opts, metadata: { ...META, role: 'pause' } })
  await other.files.write('/tmp/kept.txt', 'kept')
  await other.commands.run('python3 -m http.server 8000 -d /tmp', { background: true })
  for (let i = 0; i < 100 && !(await other.commands.run('python3 -c "import socket; socket.create_connection((\'127.0.0.1\', 8000))" && echo up || true')).stdout.includes('up'); i++) {
    await new Promise((r) => setTimeout(r, 200))
  }
  assert.equal(await other.pause(), true)
  assert.equal((await other.getInfo()).state, 'paused')
  const paused = await Sandbox.list({ query: { metadata: { run: RUN, role: 'pause' }, state: ['paused'] } }).nextItems()
  assert.deepEqual(paused.map((s) => s.sandboxId), [other.sandboxId])
  const back = await Sandbox.connect(other.sandboxId)
  assert.equal((await back.getInfo()).state, 'running')
  assert.equal(await back.files.read('/tmp/kept.txt'), 'kept')
  const res = await fetch(`https://${back.getHost(8000)}/kept.txt`)
  assert.equal(await res.text(), 'kept')
  assert.equal(await back.kill(), true)
  assert.equal(await Sandbox.kill(other.sandboxId), false)
})

test('list: filters and pages', async () => {
  const extra = await Sandbox.create('base', { ...opts, metadata: { ...META, role: 'list' } })
  try {
    const mine = await Sandbox.list({ query: { metadata: { run: RUN, role: 'list' } } }).nextItems()
    assert.deepEqual(mine.map((s) => s.sandboxId), [extra.sandboxId])
    const p = Sandbox.list({ query: { metadata: { run: RUN } }, limit: 1 })
    const seen = []
    while (p.hasNext) seen.push(...(await p.nextItems()).map((s) => s.sandboxId))
    assert.ok(seen.includes(extra.sandboxId) && seen.includes(sbx.sandboxId), JSON.stringify(seen))
    assert.equal(new Set(seen).size, seen.length)
  } finally {
    await extra.kill()
  }
})

test('a killed sandbox: 502 from its envd, not found from the API', async () => {
  const gone = await Sandbox.create('base', { ...opts, metadata: { ...META, role: 'gone' } })
  const running = await gone.commands.run('sleep 600', { background: true })
  const t0 = Date.now()
  await gone.kill()
  // The kill cuts the command's open stream.
  await assert.rejects(running.wait())
  assert.ok(Date.now() - t0 < 30_000, `the stream ended ${Date.now() - t0} ms after the kill`)
  assert.equal(await gone.isRunning(), false)
  await assert.rejects(gone.commands.run('true'))
  await assert.rejects(Sandbox.getInfo(gone.sandboxId), (e) => e instanceof NotFoundError || /not found/i.test(e.message))
})

test('the listener is no door: a sandbox made with SPACE\'s API keeps its ports and envd private', async () => {
  // Made through SPACE's own API, never through the facade.
  const res = await fetch(`${process.env.SPACE_API_URL}/v1/sandboxes`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${process.env.SPACE_API_KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ labels: META, timeout_seconds: 600 }),
  })
  assert.equal(res.status, 201, await res.clone().text())
  const id = (await res.json()).id.replace(/^sbx_/, '')
  try {
    // Its team reaches it through the SDK, which sends the access token.
    const own = await Sandbox.connect(id)
    await own.files.write('/tmp/www/index.html', 'private page')
    await own.commands.run('python3 -m http.server 8000 -d /tmp/www', { background: true })
    const info = await (await fetch(`https://api.${process.env.E2B_DOMAIN}/sandboxes/${id}`, {
      headers: { 'X-API-KEY': process.env.E2B_API_KEY },
    })).json()
    const url = `https://${own.getHost(8000)}/index.html`
    let ok
    for (let i = 0; i < 100; i++) {
      ok = await fetch(url, { headers: { 'X-Access-Token': info.envdAccessToken } })
      if (ok.status === 200) break
      await new Promise((r) => setTimeout(r, 200))
    }
    assert.equal(await ok.text(), 'private page')
    // Anyone else: no credentials, headers only, or another sandbox's token.
    assert.equal((await fetch(url)).status, 403)
    const viaHeaders = await fetch(`https://${process.env.E2B_DOMAIN}/index.html`, {
      headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': '8000' },
    })
    assert.equal(viaHeaders.status, 403)
    assert.equal((await fetch(url, { headers: { 'X-Access-Token': sbx.envdAccessToken ?? 'spe2b_forged' } })).status, 403)
    for (const path of ['/health', '/files?path=/tmp/www/index.html']) {
      const envd = await fetch(`https://49983-${id}.${process.env.E2B_DOMAIN}${path}`)
      assert.equal(envd.status, 401, path)
    }
  } finally {
    await Sandbox.kill(id)
  }
})
