package proxy

import (
	"context"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/control"
)

// openControl opens the control plane on the server's gate, unless the
// config turns it off (nil then). Close closes it before the gate.
func (s *Server) openControl(ctx context.Context, cfg *config.Config) (*control.Plane, error) {
	if cfg.Control.Disabled {
		return nil, nil
	}
	c, err := control.Open(ctx, s.gate, control.Options{Logger: s.log})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, c.Close)
	return c, nil
}
