// Preload (`node --import ./loopback.mjs server.js`): every server this process starts listens on
// 127.0.0.1 only, whatever host it asks for. For servers that cannot be told (server-everything calls
// `app.listen(PORT)`, which binds every interface).
import net from 'node:net';

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'number' || (typeof args[0] === 'string' && /^\d+$/.test(args[0]))) {
    const port = Number(args[0]);
    const rest = args.slice(1).filter(a => typeof a === 'function');
    return listen.call(this, { port, host: '127.0.0.1' }, ...rest);
  }
  if (args[0] && typeof args[0] === 'object' && 'port' in args[0]) {
    return listen.call(this, { ...args[0], host: '127.0.0.1' }, ...args.slice(1));
  }
  return listen.apply(this, args);
};
