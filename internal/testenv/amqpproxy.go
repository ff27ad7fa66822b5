package testenv

import (
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// AMQPProxy is a TCP proxy in front of RabbitMQ that reads the server's
// side of the AMQP 0-9-1 stream frame by frame, so that it can slip in
// frames of its own between the server's: Block sends every client what a
// broker under a memory or disk alarm sends, connection.blocked, and
// Unblock sends connection.unblocked. The client library sees a real
// notification from the wire, and the shared broker raises no alarm.
type AMQPProxy struct {
	t        testing.TB
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	conns   map[*amqpConn]bool
	blocked string // the reason while blocked; "" when not
}

// amqpConn is one client connection through the proxy.
type amqpConn struct {
	client, server net.Conn
	mu             sync.Mutex // one frame at a time to the client
	open           bool       // the server sent connection.open-ok
}

// AMQP 0-9-1 framing (section 4.2.3 of the specification): type, channel,
// size, payload, frame-end.
const (
	frameMethod     = 1
	frameEnd        = 0xCE
	classConnection = 10
	methodOpenOK    = 41
	methodBlocked   = 60
	methodUnblocked = 61
)

// NewAMQPProxy starts a proxy to upstream ("host:port") on a free local
// port, stopped when t ends.
func NewAMQPProxy(t testing.TB, upstream string) *AMQPProxy {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: AMQP proxy: %v", err)
	}
	p := &AMQPProxy{t: t, ln: ln, upstream: upstream, conns: map[*amqpConn]bool{}}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for c := range p.conns {
			_ = c.client.Close()
			_ = c.server.Close()
		}
	})
	return p
}

// Rewrite returns the amqp:// URL rawURL pointed at the proxy.
func (p *AMQPProxy) Rewrite(rawURL string) string {
	p.t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		p.t.Fatalf("testenv: %v", err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

// Block sends connection.blocked with reason to every open connection, and
// to each connection that opens until Unblock, as RabbitMQ does while a
// resource alarm lasts.
func (p *AMQPProxy) Block(reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = reason
	for c := range p.conns {
		if c.open {
			c.send(blockedFrame(reason))
		}
	}
}

// Unblock sends connection.unblocked to every open connection.
func (p *AMQPProxy) Unblock() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = ""
	for c := range p.conns {
		if c.open {
			c.send(methodFrame(classConnection, methodUnblocked, nil))
		}
	}
}

func (p *AMQPProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed at cleanup
		}
		server, err := (&net.Dialer{}).Dial("tcp", p.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &amqpConn{client: client, server: server}
		p.mu.Lock()
		p.conns[c] = true
		p.mu.Unlock()
		go func() { // client to server: as it comes
			_, _ = io.Copy(server, client)
			_ = server.Close()
		}()
		go func() { // server to client: frame by frame
			p.relayFrames(c)
			_ = client.Close()
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
		}()
	}
}

// relayFrames copies the server's frames to the client, one at a time,
// and notices when the connection is open.
func (p *AMQPProxy) relayFrames(c *amqpConn) {
	header := make([]byte, 7)
	for {
		if _, err := io.ReadFull(c.server, header); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(header[3:7])
		frame := make([]byte, 7+int(size)+1)
		copy(frame, header)
		if _, err := io.ReadFull(c.server, frame[7:]); err != nil {
			return
		}
		p.mu.Lock()
		if !c.send(frame) {
			p.mu.Unlock()
			return
		}
		if frame[0] == frameMethod && size >= 4 && !c.open &&
			binary.BigEndian.Uint16(frame[7:9]) == classConnection && binary.BigEndian.Uint16(frame[9:11]) == methodOpenOK {
			c.open = true
			if p.blocked != "" {
				c.send(blockedFrame(p.blocked))
			}
		}
		p.mu.Unlock()
	}
}

// send writes one whole frame to the client, and says whether it could.
func (c *amqpConn) send(frame []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.client.Write(frame)
	return err == nil
}

// blockedFrame is connection.blocked: its one argument, the reason, is a
// short string.
func blockedFrame(reason string) []byte {
	return methodFrame(classConnection, methodBlocked, append([]byte{byte(len(reason))}, reason...))
}

// methodFrame is a method frame on channel 0.
func methodFrame(class, method uint16, args []byte) []byte {
	payload := binary.BigEndian.AppendUint16(nil, class)
	payload = binary.BigEndian.AppendUint16(payload, method)
	payload = append(payload, args...)
	frame := []byte{frameMethod, 0, 0}
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(payload)))
	frame = append(frame, payload...)
	return append(frame, frameEnd)
}
