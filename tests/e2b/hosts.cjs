// Preloaded (node --require) by run.sh: every name under E2B_TEST_DOMAIN
// resolves to 127.0.0.1, where the test server's E2B listener is, as
// wildcard DNS would make it in a real deployment.
'use strict'
const dns = require('node:dns')

const domain = (process.env.E2B_TEST_DOMAIN || 'e2b.test').toLowerCase()
const original = dns.lookup

function ours(host) {
  const h = String(host).toLowerCase().replace(/\.$/, '')
  return h === domain || h.endsWith('.' + domain)
}

dns.lookup = function lookup(host, options, callback) {
  if (typeof options === 'function') {
    callback = options
    options = {}
  }
  if (!ours(host)) return original.call(dns, host, options, callback)
  const all = typeof options === 'object' && options !== null && options.all
  process.nextTick(() => {
    if (all) callback(null, [{ address: '127.0.0.1', family: 4 }])
    else callback(null, '127.0.0.1', 4)
  })
}
