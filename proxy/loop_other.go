//go:build !linux

package proxy

import "github.com/valyala/fasthttp"

// toLoop: the event-loop relay needs epoll; elsewhere every stream stays
// on the goroutine relay.
func (p *Proxy) toLoop(*fasthttp.RequestCtx, *relay) bool { return false }

func (p *Proxy) abortLoops() {}
