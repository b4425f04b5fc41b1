import { XMLBuilder, XMLParser } from 'fast-xml-parser';
const b = new XMLBuilder({ ignoreAttributes: false, attributeNamePrefix: '@_', suppressEmptyNode: true, format: false });
console.log(b.build({ domain: { '@_type': "q'\"<&", name: 'a<b>&c', devices: { disk: [{ '@_x': '1' }, { '@_x': '2' }] } } }));
const p = new XMLParser({ ignoreAttributes: false, attributeNamePrefix: '@_', parseTagValue: false, parseAttributeValue: false });
console.log(JSON.stringify(p.parse("<a t='1'><b>x &amp; y</b><b>2</b><c u='3'>text</c></a>")));
