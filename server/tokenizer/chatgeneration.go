package tokenizer

import (
	"fmt"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// generationBlock is transformers' {% generation %}...{% endgeneration %} tag (its
// AssistantTracker extension), which marks assistant text for return_assistant_tokens_mask.
// Rendering text is all we do, so the block renders its body unchanged, as transformers does
// when no mask is requested.
type generationBlock struct {
	wrapper *nodes.Wrapper
}

func (g *generationBlock) Position() *tokens.Token { return g.wrapper.Position() }

func (g *generationBlock) String() string {
	t := g.Position()
	return fmt.Sprintf("GenerationControlStructure(Line=%d Col=%d)", t.Line, t.Col)
}

func (g *generationBlock) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	return r.Inherit().ExecuteWrapper(g.wrapper)
}

func generationParser(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	wrapper, _, err := p.WrapUntil("endgeneration")
	if err != nil {
		return nil, err
	}
	if !args.Stream().End() {
		return nil, args.Error("generation takes no arguments", nil)
	}
	return &generationBlock{wrapper: wrapper}, nil
}
