//go:build !linux

package proxy

import "github.com/valyala/fasthttp"

// DefaultEventLoop is serve's --event-loop default: off where there is
// no epoll (the flag changes nothing here).
const DefaultEventLoop = false

// toLoop: the event-loop relay needs epoll; elsewhere every stream stays
// on the goroutine relay.
func (p *Proxy) toLoop(*fasthttp.RequestCtx, *relay) bool { return false }

func (p *Proxy) abortLoops() {}
