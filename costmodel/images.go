package costmodel

// Image tokens, by OpenAI's published rules.
//
// Tile models (gpt-4o, gpt-4.1, gpt-4-turbo, o1, o3, gpt-5): a "low" detail
// image costs the base tokens. Otherwise the image is scaled to fit within
// 2048×2048, then scaled down so that its shortest side is at most 768, and
// costs base + tile × the number of 512×512 tiles that cover it.
//
// Patch models (gpt-4.1-mini, gpt-4.1-nano, o4-mini, gpt-5-mini,
// gpt-5-nano): the image is covered by 32×32 patches, at most 1536 (scaled
// down to fit), and costs patches × the model's multiplier.
//
// The size is read from the image's header when the image is inline (a
// base64 data: URL of a PNG, JPEG or GIF). When it is not (a remote URL, a
// file id, another format), the estimate is the largest the rule allows: a
// reservation must not be exceeded by what the upstream bills.

import (
	"bytes"
	"encoding/base64"
	"image"
	_ "image/gif"  // header decoder for inline images
	_ "image/jpeg" // header decoder for inline images
	_ "image/png"  // header decoder for inline images
	"math"
	"strings"
)

type imageRule struct {
	id         uint32 // distinguishes rules in cache keys
	base, tile int64  // tile models
	patchMul   int64  // patch models: multiplier in hundredths; 0 for tile models
}

// imageRuleFor returns the rule of a model, chosen by its base (see
// priceTable.lookup): a fine-tune, a snapshot or an alias counts images as
// the model it is priced as.
func imageRuleFor(base string) imageRule {
	m := strings.ToLower(base)
	switch {
	case strings.HasPrefix(m, "gpt-4.1-mini"), strings.HasPrefix(m, "gpt-5-mini"):
		return imageRule{id: 1, patchMul: 162}
	case strings.HasPrefix(m, "gpt-4.1-nano"), strings.HasPrefix(m, "gpt-5-nano"):
		return imageRule{id: 2, patchMul: 246}
	case strings.HasPrefix(m, "o4-mini"):
		return imageRule{id: 3, patchMul: 172}
	case strings.HasPrefix(m, "gpt-4o-mini"):
		return imageRule{id: 4, base: 2833, tile: 5667}
	case strings.HasPrefix(m, "o1"), strings.HasPrefix(m, "o3"):
		return imageRule{id: 5, base: 75, tile: 150}
	case strings.HasPrefix(m, "gpt-5"):
		return imageRule{id: 6, base: 70, tile: 140}
	}
	return imageRule{id: 7, base: 85, tile: 170}
}

// imageTokens returns the prompt tokens of one image part for model m, and
// whether they follow from its size (exact is false for the upper bound of
// an image whose size is not in the request).
func imageTokens(m model, url, detail string) (n int64, exact bool) {
	w, h, ok := inlineImageSize(url)
	return imageRuleFor(m.base).tokens(w, h, ok, detail)
}

// tokens returns the tokens of an image of w×h pixels at the given detail,
// or, when its size is not known (ok false), the most the rule allows.
func (r imageRule) tokens(w, h int, ok bool, detail string) (n int64, exact bool) {
	if r.patchMul > 0 {
		patches := int64(1536)
		if ok {
			patches = imagePatches(w, h)
		}
		return mulDivCeil(patches, r.patchMul, 100), ok
	}
	if strings.EqualFold(detail, "low") {
		return r.base, true
	}
	tiles := int64(8) // 768×2048, the most tiles an image can need
	if ok {
		tiles = imageTiles(w, h)
	}
	return r.base + r.tile*tiles, ok
}

func imageTiles(w, h int) int64 {
	fw, fh := float64(w), float64(h)
	if fw > 2048 || fh > 2048 {
		s := 2048 / math.Max(fw, fh)
		fw, fh = math.Floor(fw*s), math.Floor(fh*s)
	}
	if short := math.Min(fw, fh); short > 768 {
		s := 768 / short
		fw, fh = math.Floor(fw*s), math.Floor(fh*s)
	}
	return int64(math.Ceil(fw/512) * math.Ceil(fh/512))
}

func imagePatches(w, h int) int64 {
	fw, fh := float64(w), float64(h)
	p := math.Ceil(fw/32) * math.Ceil(fh/32)
	if p <= 1536 {
		return int64(p)
	}
	s := math.Sqrt(32 * 32 * 1536 / (fw * fh))
	s *= math.Min(math.Floor(fw*s/32)/(fw*s/32), math.Floor(fh*s/32)/(fh*s/32))
	p = math.Ceil(fw*s/32) * math.Ceil(fh*s/32)
	return int64(min(p, 1536))
}

// inlineImageSize reads the width and height of a base64 data: URL image
// from its header, decoding at most 96 KiB of it.
func inlineImageSize(url string) (w, h int, ok bool) {
	rest, found := strings.CutPrefix(url, "data:")
	if !found {
		return 0, 0, false
	}
	meta, data, found := strings.Cut(rest, ",")
	if !found || !strings.HasSuffix(meta, ";base64") {
		return 0, 0, false
	}
	return base64ImageSize(data)
}

// base64ImageSize reads the width and height of a base64-encoded image from
// its header, decoding at most 96 KiB of it.
func base64ImageSize(data string) (w, h int, ok bool) {
	const maxB64 = 128 << 10
	if len(data) > maxB64 {
		data = data[:maxB64]
	}
	data = data[:len(data)/4*4]
	raw, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return 0, 0, false
	}
	cfg, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 {
		return 0, 0, false
	}
	return cfg.Width, cfg.Height, true
}
