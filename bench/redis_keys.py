"""Writes N Redis `SET key:<12 digits> val EX ttl` commands in RESP to stdout, for
`redis-cli --pipe`: the key names redis-benchmark's `key:__rand_int__` uses. With a third
argument `plain`, the keys are `key:<n>`: the names `ttlwheel-load --prefix key:` uses."""
import sys

count, ttl = int(sys.argv[1]), sys.argv[2].encode()
name = b"key:%d" if sys.argv[3:] == ["plain"] else b"key:%012d"
out = sys.stdout.buffer
for i in range(count):
    key = name % i
    out.write(b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$3\r\nval\r\n$2\r\nEX\r\n$%d\r\n%s\r\n" % (len(key), key, len(ttl), ttl))
